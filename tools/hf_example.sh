#!/usr/bin/env bash
# Run transformers' own example run_qa_no_trainer.py offline, to compare against qa-train on the same
# model, data and hyper-parameters. Needs the git-ignored .hfex/ folder at the repo root: whl/ (datasets 4.8,
# evaluate 0.4 and what they import that the GPU image lacks, for CPython 3.12; the image has pyarrow and pandas,
# which would not fit the device's carry limit), run_qa_no_trainer.py + utils_qa.py (upstream, patched only
# where they need the network or no longer import under transformers 5; see .hfex/PATCH.md).
#
#   tools/hf_example.sh --flatten IN.json OUT.json   nested SQuAD JSON -> the flat layout the example reads
#   tools/hf_example.sh --check                      exit 0 if .hfex/ is complete, else say what is missing, exit 2
#   tools/hf_example.sh EXAMPLE_ARGS...              install the wheels to $HFSITE, run the example
#
# .hfex/ is made by tools/hf_example_prepare.sh (it holds upstream code, so it stays out of the repository):
# .hfex/PATCH.md says where the two files came from, the edits, and which wheels whl/ holds.
#
# The example reads --train_file/--validation_file with datasets' json loader and field="data", so it needs
# {"data": [{"id", "title", "context", "question", "answers": {"text": [...], "answer_start": [...]}}, ...]}
# (the file name must end in .json), not the official nested {"data": [{"title", "paragraphs": [...]}]}.
#
# Environment: PYTHON (default python3), HFSITE (default /tmp/hfsite), MIXED_PRECISION (default bf16),
# HFWHL (default .hfex/whl; another folder of wheels for another Python, e.g. a CPU test under 3.11).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
HFSITE="${HFSITE:-/tmp/hfsite}"
HFWHL="${HFWHL:-$ROOT/.hfex/whl}"

if [[ "${1:-}" == "--flatten" ]]; then
    [[ $# -eq 3 ]] || { echo "usage: $0 --flatten IN.json OUT.json" >&2; exit 2; }
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" - "$2" "$3" <<'PY'
import json
import sys

from qa_train.data.load import load_file

# qa_train's own reader walks the nesting (a malformed file is a DataError naming the record); rows as the hub's
# "squad" dataset has them, unanswerable questions with empty answer lists.
src, dst = sys.argv[1], sys.argv[2]
ex = load_file(src, "optional")
rows = [{"id": i, "title": t, "context": c, "question": q, "answers": {"text": a, "answer_start": s}}
        for i, t, c, q, a, s in zip(ex.ids, ex.titles, ex.contexts, ex.questions, ex.answer_texts, ex.answer_starts)]
with open(dst, "w", encoding="utf-8") as f:
    json.dump({"data": rows}, f, ensure_ascii=False)
print(f"hf_example: {src} -> {dst}: {len(rows)} questions")
PY
fi

shopt -s nullglob
wheels=("$HFWHL"/*.whl)
missing=()
[[ ${#wheels[@]} -gt 0 ]] || missing+=("$HFWHL/*.whl")
for f in run_qa_no_trainer.py utils_qa.py PATCH.md; do [[ -f $ROOT/.hfex/$f ]] || missing+=("$ROOT/.hfex/$f"); done
if [[ ${#missing[@]} -gt 0 ]]; then
    printf -v list ', no %s' "${missing[@]}"
    echo "hf_example: ${list:2} (make it with: bash tools/hf_example_prepare.sh)" >&2; exit 2
fi
[[ "${1:-}" == "--check" ]] && exit 0

"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$HFSITE" "${wheels[@]}"
# The wheels' datasets/evaluate first; the repo root for `qa_train` (the offline squad metric imports it).
export PYTHONPATH="$HFSITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

rc=0
start=$(date +%s.%N)  # the example's own run (launcher, data, training, eval), not the install above
"$PYTHON" -m accelerate.commands.launch --num_processes 1 --num_machines 1 \
    --mixed_precision "${MIXED_PRECISION:-bf16}" --dynamo_backend no \
    "$ROOT/.hfex/run_qa_no_trainer.py" "$@" || rc=$?
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v rc="$rc" 'BEGIN { printf "hf_example: wall_s=%.1f rc=%d\n", e - s, rc }'
exit "$rc"
