"""Every test here runs a script as a user does (a subprocess, torchrun) or compiles or traces for long: slow by where
it lives. `python -m pytest -m "not slow"` leaves this folder out."""
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
