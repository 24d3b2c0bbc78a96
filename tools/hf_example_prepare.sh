#!/usr/bin/env bash
# Build the git-ignored .hfex/ that tools/hf_example.sh needs, from scratch: transformers' run_qa_no_trainer.py and
# utils_qa.py (examples/pytorch/question-answering/), patched only where they need the network or no longer match
# transformers 5; whl/, the wheels of datasets and evaluate and what they import that the GPU image lacks (CPython
# 3.12, manylinux x86_64); PATCH.md, where each came from and every edit.
#
#   tools/hf_example_prepare.sh [--from DIR] [--force]       build .hfex; a complete one is kept unless --force
#   tools/hf_example_prepare.sh --wheels-only DIR [--python 3.11]
#                                                            only the wheels, for another Python (a CPU run:
#                                                            HFWHL=DIR bash tools/hf_example.sh ...)
#
# transformers' sdist on PyPI ships no examples/, so the two files come from --from DIR (a transformers checkout,
# or a folder holding the two files) or, without it, from GitHub at the pinned commits below (that needs access to
# it; the project's machines have none). A build keeps the two files as they came in .hfex/upstream/, and a
# later --force without --from rebuilds from them. Files whose sha256 differs from the pinned ones are used with a
# warning, and PATCH.md says so: the patches below then fail loudly if a line they edit is not there.
#
# It builds in .hfex.partial.* beside .hfex and renames, so a failure leaves no half folder. .hfex travels to the
# GPU machine with .device within the device's 64 MiB carry limit: the size is printed at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"  # any Python 3 with pip: it patches text and downloads wheels, it imports neither

REPO=huggingface/transformers
EXDIR=examples/pytorch/question-answering
# The newest copies the project could read (run_qa_no_trainer.py of the 4.51.0.dev0 era); what they pin is the text.
declare -A COMMIT=([run_qa_no_trainer.py]=015bfeb86891c5f5e450f48942260ac3e2cd2bf2
                   [utils_qa.py]=e3b8f49f021f206cf09529ed0810d0df7e8d7656)
declare -A SHA256=([run_qa_no_trainer.py]=24a208e0b9bca54adc03751ddcc02eaa601a98be1260f7b98158054f2d39a4ca
                   [utils_qa.py]=e418d7ecf0f8df199c7bd2a771e0c1257a62f7f6e515b00f7c572e1ba062ed96)
WANT=(datasets==4.8.5 evaluate==0.4.6)
# What the GPU image already has (shared/device/prepare.sh lists it; its site-packages cannot be seen from here):
# torch, transformers 5 and what transformers and huggingface_hub 1 require, pyarrow and pandas (pyarrow alone is
# 55 MB, past what .device leaves of the carry limit) with theirs. aiohttp and its kin stay out too: datasets
# imports it only if present, for remote files (fsspec's http). Kept: datasets, evaluate, dill, multiprocess,
# xxhash, fsspec (datasets caps its version, the image's may be newer), requests and its two (half a MB).
IMAGE_HAS=(numpy pandas pyarrow python_dateutil tzdata six torch transformers tokenizers safetensors huggingface_hub
           hf_xet tqdm pyyaml packaging filelock typing_extensions httpx httpcore h11 anyio certifi idna click
           aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl)

die() { echo "hf_example_prepare: $*" >&2; exit 2; }

from="" force=0 only="" pyver=3.12
while [[ $# -gt 0 ]]; do
    case $1 in
        --from) from=${2:?--from needs a folder}; shift 2 ;;
        --force) force=1; shift ;;
        --wheels-only) only=${2:?--wheels-only needs a folder}; shift 2 ;;
        --python) pyver=${2:?--python needs a version, e.g. 3.11}; shift 2 ;;
        *) die "unknown argument $1 (see the header of $0)" ;;
    esac
done

DROPPED=()
wheels() {  # DEST PYVER: WANT and their dependencies as binary wheels, less IMAGE_HAS (named in DROPPED)
    local dest=$1 all w name
    all=$(mktemp -d)
    "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --implementation cp \
        --python-version "$2" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$all" "${WANT[@]}"
    mkdir -p "$dest"
    for w in "$all"/*.whl; do
        name=$(basename "$w"); name=${name%%-*}
        if [[ " ${IMAGE_HAS[*]} " == *" ${name,,} "* ]]; then DROPPED+=("$(basename "$w")"); else cp "$w" "$dest/"; fi
    done
    rm -rf "$all"
}

if [[ -n $only ]]; then
    wheels "$only" "$pyver"
    ls "$only"; du -sh "$only"
    exit 0
fi
if [[ $force == 0 ]] && HFWHL="" bash tools/hf_example.sh --check > /dev/null 2>&1; then
    echo "hf_example_prepare: .hfex is complete, left alone (--force rebuilds it)"; du -sh .hfex; exit 0
fi

[[ -z $from && -d .hfex/upstream ]] && from=.hfex/upstream  # an earlier build's pristine copies
tmp=$(mktemp -d "$ROOT/.hfex.partial.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/upstream"
declare -A ORIGIN
for f in run_qa_no_trainer.py utils_qa.py; do
    if [[ -n $from ]]; then
        src=$from/$EXDIR/$f; [[ -f $src ]] || src=$from/$f
        [[ -f $src ]] || die "no $from/$EXDIR/$f nor $from/$f"
        cp "$src" "$tmp/upstream/$f"; ORIGIN[$f]=$(cd "$(dirname "$src")" && pwd)/$f
    else
        url=https://raw.githubusercontent.com/$REPO/${COMMIT[$f]}/$EXDIR/$f
        curl -fsSL --max-time 60 -o "$tmp/upstream/$f" "$url" \
            || die "cannot download $url; pass --from DIR (a transformers checkout or a folder with the two files)"
        ORIGIN[$f]=$url
    fi
    sum=$(sha256sum "$tmp/upstream/$f" | cut -d' ' -f1)
    if [[ $sum != "${SHA256[$f]}" ]]; then
        echo "hf_example_prepare: warning: $f is not the pinned text (sha256 $sum); the edits may not apply" >&2
        COMMIT[$f]="$(git -C "${from:-.}" rev-parse HEAD 2> /dev/null || echo unknown) (not the pinned text)"
    fi
done

# The edits, each on text that must be there exactly once; their list goes into PATCH.md as printed.
"$PY" - "$tmp/upstream" "$tmp" > "$tmp/edits.md" <<'PY'
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
SCORER = '''# qa-train: evaluate.load("squad") fetches the metric's code from the hub. The same keys, scored with the
# official scripts' semantics by qa_train/squad/scoring.py (which also applies Unicode NFC to both sides);
# tools/hf_example.sh puts the repo root on PYTHONPATH.
from qa_train.squad.scoring import score, score_v2  # noqa: E402


class OfflineSquad:
    def __init__(self, v2):
        self.v2 = v2

    def compute(self, predictions, references):
        golds = {r["id"]: list(r["answers"]["text"]) for r in references}
        texts = {p["id"]: p["prediction_text"] for p in predictions}
        if not self.v2:
            result = score(golds, texts)
            return {"exact_match": result["exact_match"], "f1": result["f1"]}
        return score_v2(golds, texts, {p["id"]: p["no_answer_probability"] for p in predictions})
'''
TELEMETRY = (
    "    # Sending telemetry. Tracking the example usage helps us better allocate resources to maintain them. The\n"
    "    # information sent is the one passed as arguments along with your Python/PyTorch versions.\n"
    '    send_example_telemetry("run_qa_no_trainer", args)\n\n'
)
EDITS = [  # (old, new, why), applied in order
    ("# You can also adapt this script",
     "# Patched for qa-train by tools/hf_example_prepare.sh to run offline: see PATCH.md beside this file.\n"
     "# You can also adapt this script",
     "a comment after the module docstring saying the file is patched, and where the edits are listed"),
    ("from transformers.utils import check_min_version, send_example_telemetry\n",
     "from transformers.utils import check_min_version\n",
     "`send_example_telemetry` dropped from the import: transformers 5 no longer has it (ImportError)"),
    (TELEMETRY, "", "the telemetry call in `main()` and its two comment lines removed (it needs the network)"),
    ("\n\ndef save_prefixed_metrics(", "\n\n" + SCORER + "\n\ndef save_prefixed_metrics(",
     "`OfflineSquad` added before `save_prefixed_metrics`: `compute()` returns what evaluate's squad and squad_v2 "
     "return, from `qa_train.squad.scoring.score` / `score_v2`"),
    ('    metric = evaluate.load("squad_v2" if args.version_2_with_negative else "squad")\n',
     "    metric = OfflineSquad(args.version_2_with_negative)  # qa-train: was evaluate.load(...), see above\n",
     '`metric = evaluate.load("squad_v2" if ... else "squad")` replaced by `OfflineSquad(...)`: it needs the network '
     "(`import evaluate` stays: importing needs none)"),
]
text = (src / "run_qa_no_trainer.py").read_text(encoding="utf-8")
for old, new, why in EDITS:
    if text.count(old) != 1:
        sys.exit(f"hf_example_prepare: run_qa_no_trainer.py: {old.strip()[:70]!r} found {text.count(old)} times, "
                 f"expected once; the edit: {why}")
    text = text.replace(old, new)
    print(f"- run_qa_no_trainer.py: {why}.")
(dst / "run_qa_no_trainer.py").write_text(text, encoding="utf-8")
(dst / "utils_qa.py").write_text((src / "utils_qa.py").read_text(encoding="utf-8"), encoding="utf-8")
print("- utils_qa.py: none (copied as it is).")
PY

wheels "$tmp/whl" 3.12
{
    echo "# .hfex: transformers' question-answering example, offline"
    echo
    echo "Made by tools/hf_example_prepare.sh on $(date -u +%F) (qa-train commit $(git rev-parse --short HEAD));"
    echo "run by tools/hf_example.sh. Nothing here was edited by hand."
    echo
    echo "## Sources (repository $REPO, folder $EXDIR/)"
    for f in run_qa_no_trainer.py utils_qa.py; do
        echo "- $f: commit ${COMMIT[$f]}, sha256 $(sha256sum "$tmp/upstream/$f" | cut -d' ' -f1), from ${ORIGIN[$f]}"
    done
    echo
    echo "## Edits"
    cat "$tmp/edits.md"
    echo
    echo "## whl/ (CPython 3.12, manylinux x86_64; ${WANT[*]} and their dependencies)"
    for w in "$tmp"/whl/*.whl; do echo "- $(basename "$w") ($(du -k "$w" | cut -f1) KiB)"; done
    echo
    echo "Downloaded as dependencies but left out: the GPU image has them (aiohttp and its kin: nothing imports them"
    echo "offline)."
    printf -- '- %s\n' "${DROPPED[@]}"
} > "$tmp/PATCH.md"
rm -f "$tmp/edits.md"  # upstream/ stays: the pristine files, what --force rebuilds from without --from

# Swap in the complete folder; the old one (--force) goes only once the new one is in place.
[[ -e .hfex ]] && mv .hfex "$tmp.old"
mv "$tmp" .hfex
rm -rf "$tmp.old"
trap - EXIT
echo "hf_example_prepare: .hfex ready, $(find .hfex/whl -name '*.whl' | wc -l) wheels; the carry limit is 64 MiB in all:"
du -sh .hfex .device 2> /dev/null || du -sh .hfex
