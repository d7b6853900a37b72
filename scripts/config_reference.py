"""Write (or, with --check, compare) docs/reference/config.md: the configuration reference drawn
from the config models of the core and of the project's own plugins (rlweave.config.reference).

    python scripts/config_reference.py           # write the page
    python scripts/config_reference.py --check   # exit 1 when the page is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"


def render() -> str:
    from rlweave.config.reference import reference_markdown
    from rlweave.config.schema import RunConfig
    from rlweave.plugins.manager import get_plugin_manager

    ours = [p.record for p in get_plugin_manager().providers()
            if p.plugin.distribution == "rlweave" or p.plugin.distribution.startswith("rlweave-")]
    return reference_markdown(RunConfig, ours)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    a = ap.parse_args()
    text = render()
    if a.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
