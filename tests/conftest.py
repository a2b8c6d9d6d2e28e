from __future__ import annotations

import pytest
import torch

from tests.helpers import cache_compiled_templates, snapshot_template

# Every render of this process (each xdist worker is one) reuses the templates that an earlier
# render compiled: renders are the same, in less than half the time.
cache_compiled_templates()


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """A copy of the template as Copier reads it, shared by the whole session."""
    return snapshot_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """Tests run two at a time on two cores: more threads would only fight."""
    torch.set_num_threads(1)
