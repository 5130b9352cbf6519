#!/bin/bash
# The --device cuda check, for a machine with a GPU and its own Python + torch (not run in CI; see docs/TA.md).
# Grades the complete and the half-done example notebooks of every assignment on CUDA through the pytest
# path and `course grade` (two worker processes), and writes each results.json to $OUT (default ./device-out).
# Expects the packages the grader needs beyond torch as wheels in .whl/ and MNIST's IDX files in .mnist/.
set -u
OUT=${OUT:-device-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # into the interpreter's own environment: the sandbox binds it read-only
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD COURSE_MNIST_DIR=$PWD/.mnist COURSE_MNIST_DOWNLOAD=0 PYTHONUNBUFFERED=1 COURSE_NO_CACHE=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
for aid in lab14_transformers w8l4_transformers w8l1_attention_vision; do
  python3 -c "from autograder.notebooks.examples import write_examples; write_examples('$aid', '/tmp/ex/$aid')" || exit 1
  for example in complete partly_right; do
    extra=(); [ "$example" = complete ] || extra=(--no-experiments)
    start=$(date +%s.%N)
    python3 -m pytest "autograder/suites/test_$aid.py" -p autograder.grading.plugin -p no:cacheprovider -o addopts= -q \
      --submission "/tmp/ex/$aid/$example/$aid.ipynb" --device cuda --results-json "$OUT/${aid}_$example.json" "${extra[@]}" \
      2>&1 | grep -v "^\.\|^$" | tail -15
    echo "TIME $aid $example $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
  done
done
start=$(date +%s.%N)
python3 -m autograder.cli grade /tmp/ex/lab14_transformers -a lab14_transformers --device cuda --workers 2 \
  --json "$OUT/batch_lab14.json" 2>&1 | tail -12
echo "TIME batch lab14 x4 workers 2 $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
