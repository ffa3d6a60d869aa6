"""The reference worker's old import path: it lives in `devbridge.apps.worker` now."""

from devbridge.apps.worker import *  # noqa: F403  (its __all__: every public name)
from devbridge.testing import fake_pump as fake_pump
