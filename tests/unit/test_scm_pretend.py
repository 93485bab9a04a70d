"""The VCS version handed to a build: both pretend-version names, and a local label a setup.py appends."""
from builder.sources import scmversion


def test_pretend_env_sets_the_plain_name_too() -> None:
    # vLLM's setup.py calls setuptools_scm.get_version() without a dist name: only the plain name reaches it
    env = scmversion.pretend_env("vllm", "0.33.1.dev1+g9752642941")
    assert env == {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM": "0.33.1.dev1+g9752642941",
                   "SETUPTOOLS_SCM_PRETEND_VERSION": "0.33.1.dev1+g9752642941"}


def test_same_version_accepts_an_appended_local_label() -> None:
    assert scmversion.same_version("0.33.1.dev1+g9752642941.cpu", "0.33.1.dev1+g9752642941")
    assert scmversion.same_version("1.2.3+cpu", "1.2.3")
    assert scmversion.same_version("1.2.3", "1.2.3")


def test_same_version_refuses_another_version() -> None:
    assert not scmversion.same_version("0.33.0", "0.33.1.dev1+g9752642941")
    assert not scmversion.same_version("1.2.30", "1.2.3")
    assert not scmversion.same_version("1.2.3.post1", "1.2.3")
