"""convmem: short-term conversation memory for LLM planners, event-sourced on NATS JetStream."""

__version__ = "0.1.0"
