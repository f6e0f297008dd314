"""Sample turns the summarizers' tests share: a short pricing conversation with names, prices and dates."""

from __future__ import annotations

from typing import Any

PRICING_TURNS: list[dict[str, Any]] = [
    {
        "user": "Hi, I run an online clothing store on Shopify. My email is ana.lopez@example.com.",
        "assistant": "Welcome, Ana López! Basic is $19/month and Pro is $49/month; annual billing saves 10%.",
        "trajectory_digest": {
            "tools_invoked": ["search_pricing"],
            "observations_summary": "Retrieved 3 pricing tier options.",
        },
    },
    {
        "user": "I'll take the Pro tier with annual billing, starting March 3.",
        "assistant": "Done: Pro starts on 2024-03-03 and costs $529/year. I'll send the invoice tomorrow.",
        "trajectory_digest": {"tools_invoked": ["calculate_discount"]},
    },
]
