import warnings

import pytest

from tests.parallel._common import launch


@pytest.fixture(scope="session")
def two_rank_runs(request, tmp_path_factory):
    """The run folders of every 2-rank layout that this session's test files here name (their module-level
    TWO_RANK_LAYOUTS; their two_rank_args(out) adds worker arguments), trained by tests/parallel/_worker.py in one
    launch: starting a launch is the slow part."""
    from pathlib import Path

    modules = sorted({item.module for item in request.session.items if item.module is not None},
                     key=lambda m: m.__name__)
    layouts = dict.fromkeys(name for module in modules for name in getattr(module, "TWO_RANK_LAYOUTS", ()))

    def attempt():
        out = tmp_path_factory.mktemp("two_ranks")
        extra = [arg for module in modules if hasattr(module, "two_rank_args") for arg in module.two_rank_args(out)]
        launch(2, Path(__file__).parent / "_worker.py", "--out", out, "--layouts", ",".join(layouts), *extra)
        return out

    try:
        return attempt()
    except AssertionError as err:
        if "SIGSEGV" not in str(err):
            raise
        # A rank died in native code once on CI (not reproduced here): the launch is repeated once, in a fresh
        # folder, and says so with the crashed rank's native traceback (the worker enables faulthandler).
        warnings.warn(f"the 2-rank launch crashed and was repeated once:\n{str(err)[-4000:]}")
        return attempt()
