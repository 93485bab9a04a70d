"""pins/demo.yaml pins exactly the PR heads the demo generator publishes."""
from pathlib import Path

from builder.pins import model as pins_mod
from demo.make_stack import make_stack

ROOT = Path(__file__).resolve().parents[2]


def test_demo_pins_match_generated_pr_heads(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)["repos"]
    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    for name, comp in pins.components.items():
        repo = Path(comp.url).name.removesuffix(".git")
        entry = stack[repo]
        assert comp.pr == entry["pr"]
        assert comp.commit == entry["prs"][str(comp.pr)]["head"]
        assert comp.target == "main"
