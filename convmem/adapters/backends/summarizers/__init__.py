"""Summarizers: what turns old turns into a session's summary.

* `ExtractiveSummarizer`, the offline default: no model, deterministic to the
  byte, keeps the sentences that carry the most content per token, dated.
* `OpenAIChatSummarizer`: any OpenAI-compatible chat-completions endpoint.
* `ProcessSummarizer`: a CPU-bound summarizer (the extractive one) run in a
  warm worker process of its own (`_process`, the child's side in
  `_process_child`), so its work does not hold this process's interpreter.
* `recommended(total_tokens)`: the offline configuration for a token budget,
  a `MemorySetup` holding the session config and the summarizer sized to it.
"""

from convmem.adapters.backends.summarizers._extractive import ExtractiveSummarizer
from convmem.adapters.backends.summarizers._openai import OpenAIChatSummarizer
from convmem.adapters.backends.summarizers._process import ProcessSummarizer
from convmem.adapters.backends.summarizers._recommended import MemorySetup, recommended

__all__ = ["ExtractiveSummarizer", "MemorySetup", "OpenAIChatSummarizer", "ProcessSummarizer", "recommended"]
