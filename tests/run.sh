#!/usr/bin/env bash
# The test command: builds everything the tests need on a fresh machine, then runs them.
#   1. .venv-test: torch + torchvision (ComfyUI needs both), the project's requirements, test extras,
#      a real ComfyUI from the package registry, the newest ComfyUI frontend (its own folder), Debian's
#      chromium; the whole suite runs there
#      with NEWEST_TRANSFORMERS and NEWEST_TORCH, the newest releases tested (pinned, so that the versions the
#      README states are the ones tested: tests/test_readme.py checks both; raise them together).
#   2. .venv-test-oldest: the oldest supported transformers, for the tests that touch transformers, and the
#      oldest torch compile=True runs on (compiled_regions.OLDEST_TESTED_TORCH; older ones run eagerly), for the
#      compiled tests.
# Every tier runs even when an earlier one fails; each prints one summary line (passed / failed / skipped /
# minutes), and the command exits non-zero at the end if any tier failed or collected no test.
# Extra arguments go to both pytest runs (e.g. `bash tests/run.sh -k janus`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
OLDEST_TRANSFORMERS=4.52.1  # keep in step with requirements.txt
NEWEST_TRANSFORMERS=5.25.0  # the newest release tested, within requirements.txt's range; the README states it
NEWEST_TORCH=2.14.1  # the newest torch tested (torchvision: the release made for it); the README states it
OLDEST_TORCH=2.11.0  # keep in step with OLDEST_TESTED_TORCH in scd_core/compiled/compiled_regions.py (compile=True)

pip_install() { "$1/bin/pip" install --quiet --disable-pip-version-check "${@:2}"; }

SUMMARIES=()
TOTALS=(0 0 0)  # passed, failed, skipped over every tier
FAILED=0
EXTRA_ARGS=$#
# run_tier NAME VENV PYTEST-ARGS...: one pytest run, read back from its JUnit report for the summary at the end
run_tier() {
  local name=$1 venv=$2 started=$SECONDS status=0 report=".cache/test-results/$1.xml"
  mkdir -p .cache/test-results && rm -f "$report"
  "$venv/bin/python" -m pytest --junitxml="$report" "${@:3}" || status=$?
  # exit 5, no test collected, fails the whole suite, not a tier that extra arguments (-k ...) left empty
  if [[ $status -eq 5 && $EXTRA_ARGS -gt 0 ]]; then status=0; fi
  local counts
  counts=($("$venv/bin/python" - "$report" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    suites = list(ET.parse(sys.argv[1]).getroot().iter("testsuite"))
except (OSError, ET.ParseError):
    suites = []
tests, failures, errors, skipped = (sum(int(s.get(key, 0)) for s in suites)
                                    for key in ("tests", "failures", "errors", "skipped"))
broken = int(sys.argv[2]) != 0 and not failures + errors  # pytest failed outside any test (or collected none)
print(tests - failures - errors - skipped, failures + errors + broken, skipped)
PY
))
  SUMMARIES+=("$name tier: ${counts[0]} passed, ${counts[1]} failed, ${counts[2]} skipped in $(( (SECONDS - started) / 60 )) min (pytest exit $status)")
  for i in 0 1 2; do TOTALS[i]=$(( TOTALS[i] + counts[i] )); done
  if [[ $status -ne 0 ]]; then FAILED=1; fi
}

if [[ ! -x .venv-test/bin/python ]]; then "$PYTHON" -m venv .venv-test; fi
pip_install .venv-test "torch==$NEWEST_TORCH" torchvision==0.29.1
pip_install .venv-test "transformers==$NEWEST_TRANSFORMERS" -r requirements.txt -r tests/requirements.txt
.venv-test/bin/python -c "import torch, transformers; print('torch', torch.__version__, '- transformers', transformers.__version__)"
bash tests/install_comfyui.sh .venv-test .cache/comfyui
bash tests/install_frontend.sh .venv-test  # the newest frontend, served beside the pinned one (test_browser.py)
bash tests/install_browser.sh
run_tier newest .venv-test tests "$@"

if [[ ! -x .venv-test-oldest/bin/python ]]; then "$PYTHON" -m venv .venv-test-oldest; fi
pip_install .venv-test-oldest "torch==$OLDEST_TORCH" "transformers==$OLDEST_TRANSFORMERS" -r requirements.txt -r tests/requirements.txt
.venv-test-oldest/bin/python -c "import torch, transformers; print('torch', torch.__version__, '- transformers', transformers.__version__)"
run_tier oldest .venv-test-oldest tests/test_janus.py tests/test_janus4o.py tests/test_emu3.py tests/test_emu3p5.py tests/test_lumina.py tests/test_bad_folders.py tests/test_cosmos.py tests/test_glm_image.py tests/test_engine.py tests/test_device_check.py tests/test_compile.py tests/test_fetch.py \
  --deselect tests/test_fetch.py::test_the_loader_node_fetches_with_progress_then_runs "$@"  # (no ComfyUI in this venv)

printf '%s\n' "${SUMMARIES[@]}"
echo "total: ${TOTALS[0]} passed, ${TOTALS[1]} failed, ${TOTALS[2]} skipped"
exit $FAILED
