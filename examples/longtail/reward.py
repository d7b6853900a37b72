"""The long-tail task's rule reward, named in the configs as a user function
(``rewards: [{name: examples/longtail/reward.py:count_exact}]``, a path from the repository root).
"""

from __future__ import annotations


def count_exact(prompt: str, response: str, answer: object = None, **_: object) -> float:
    """1.0 when the response is exactly the expected count, else 0.0.

    ``answer`` is the record's expected response (``"7,8,9,10"`` for ``"7..10="``). Whitespace
    is ignored; anything else (a missing, wrong or extra number, a stray comma) scores 0.0.
    """
    if answer is None:
        raise ValueError("count_exact needs an 'answer' field in the data record")
    return 1.0 if "".join(response.split()) == "".join(str(answer).split()) else 0.0
