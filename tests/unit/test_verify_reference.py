"""`builder verify` takes REPOSITORY@sha256:<hex> or REPOSITORY:TAG (resolved once against the registry, later);
anything else is one line naming both forms (exit 2)."""
import pytest

from builder.core.errors import BadInput
from builder.release.verify import parse_reference

DIGEST = "sha256:" + "ab" * 32


def test_a_digest_is_taken_as_it_is() -> None:
    assert parse_reference(f"127.0.0.1:5000/demo/unified@{DIGEST}") == ("127.0.0.1:5000", "demo/unified", DIGEST)


def test_a_tag_is_left_for_the_registry_to_resolve() -> None:
    assert parse_reference("127.0.0.1:5000/demo/unified:demo") == ("127.0.0.1:5000", "demo/unified", "")


@pytest.mark.parametrize("ref", ["127.0.0.1:5000/demo/unified", "demo/unified:demo", "127.0.0.1:5000/x@sha256:12"])
def test_neither_is_one_line_naming_both_forms(ref: str) -> None:
    with pytest.raises(BadInput, match=r"expected REPOSITORY@sha256:<64 hex> or REPOSITORY:TAG") as err:
        parse_reference(ref)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
