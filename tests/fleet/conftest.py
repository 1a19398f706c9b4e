"""The fleet tests reuse the OTA harness (tests/ota/ota.py: keys, images, bundles, the
emulated board with RAUC on loop devices) and its capability check, and add goosebit.

They live apart from tests/ota so that `make ota-test` stays what it was; `make fleet-test`
runs them. Without root, RAUC, loop devices or goosebit every case skips and says why;
with OTA_REQUIRE=1 a missing capability is an error.
"""

import importlib.util
import sys
from pathlib import Path

OTA_DIR = Path(__file__).resolve().parents[1] / "ota"
sys.path.insert(0, str(OTA_DIR))

import ota  # noqa: E402  (tests/ota/ota.py, found through the path above)

_spec = importlib.util.spec_from_file_location("ota_conftest", OTA_DIR / "conftest.py")
ota_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ota_conftest)
missing_capability = ota_conftest.missing_capability
