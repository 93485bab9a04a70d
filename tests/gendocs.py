"""`make docs`: the generated parts of the docs, written from the code (the library modules have no main of
their own): docs/settings.md from builder/core/options.py (`markdown()`) and DESIGN.md's record tables, between
its records markers, from builder/core/records.py (`design_tables()`). tests/unit/test_docs.py and
tests/unit/test_architecture.py fail while either is stale."""
import re
from pathlib import Path

from builder.core import options, records

ROOT = Path(__file__).resolve().parents[1]
RECORDS = re.compile(r"(<!-- records:begin -->\n).*?(<!-- records:end -->)", re.S)


def design_with_records(text: str) -> str:
    """DESIGN.md's text with the records section written again from the records."""
    if not RECORDS.search(text):
        raise SystemExit("DESIGN.md: no <!-- records:begin --> ... <!-- records:end --> section")
    return RECORDS.sub(lambda m: m.group(1) + records.design_tables().strip() + "\n" + m.group(2), text, count=1)


def main() -> None:
    (ROOT / "docs" / "settings.md").write_text(options.markdown())
    design = ROOT / "DESIGN.md"
    design.write_text(design_with_records(design.read_text()))
    print("wrote docs/settings.md and DESIGN.md's record tables")


if __name__ == "__main__":
    main()
