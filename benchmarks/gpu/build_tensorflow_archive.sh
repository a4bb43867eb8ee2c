#!/usr/bin/env bash
# Builds the TensorFlow archive that a lent GPU machine (Python 3.12, CUDA 13, PyTorch, no TensorFlow and no
# internet) unpacks with setup_tensorflow.sh: the Python 3.12 wheels of TensorFlow, Keras, keras-hub, the CUDA 12
# runtime and the small packages they import that the machine's image lacks (or holds too old: protobuf,
# flatbuffers), unzipped into one folder, without TensorFlow's C++ headers, every shared library stripped of
# what linking no longer needs, then `tar | xz -9` cut into 58 MiB parts (one device call carries one part).
# CUPTI 12 (its tracing library) comes too: TensorFlow's profiler reads the GPU's timeline through it.
#
#   bash benchmarks/gpu/build_tensorflow_archive.sh [--training] [WORK_DIR]     (WORK_DIR: /tmp/elita-tf-archive)
#
# --training adds what elita-train reads data with and the image lacks (training/gpu_quality.sh):
# tensorflow-text (SentencePiece in the tf.data graph), tensorflow-datasets and their small dependencies, about
# 20 MiB more in the archive (300 MiB in six parts).
#
# Writes WORK_DIR/parts/part00, part01, ... and prints the unpacked and packed sizes. Needs pip (any Python:
# the wheels are chosen for CPython 3.12 on x86-64 Linux), unzip, strip, xz and split; about 600 MB of downloads,
# and xz takes 10-20 minutes on two cores (`nice -n 19` it on a shared machine).
#
# Not in the archive: libclang (TensorFlow's build-time dependency) and, without --training, tensorflow-text,
# which keras-hub imports only if it is there (for its tokenizers, which no benchmark uses). The pins are those
# of benchmarks/gpu/README.md; setup.cfg's ranges admit them.
set -euo pipefail
training=0
if [ "${1:-}" = "--training" ]; then training=1; shift; fi
work="$(mkdir -p "${1:-/tmp/elita-tf-archive}" && cd "${1:-/tmp/elita-tf-archive}" && pwd)"
python="${PYTHON:-python3}"
packages=(
  tensorflow==2.21.0 keras==3.15.1 keras-hub==0.32.0 nvidia-cuda-runtime-cu12==12.5.82 nvidia-cuda-cupti-cu12==12.5.82
  protobuf==7.36.2 flatbuffers==25.12.19
  namex==0.1.0 optree==0.20.0 kagglehub==1.0.2 kagglesdk==0.1.28
  astunparse==1.6.3 gast==0.7.0 google-pasta==0.2.0 termcolor==3.3.0
)
if [ $training = 1 ]; then
  packages+=(
    tensorflow-text==2.21.1 tensorflow-datasets==4.9.10 tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0
    simple-parsing==0.1.9 docstring-parser==0.18.0 dm-tree==0.1.10 array-record==0.8.6 immutabledict==4.3.1
    toml==0.10.2 importlib-resources==7.1.0 promise==2.3
  )
fi
mkdir -p "$work/wheels"
rm -rf "$work/site" "$work/parts"
mkdir -p "$work/site" "$work/parts"
binary=("${packages[@]}")
if [ $training = 1 ]; then
  # promise (tensorflow-datasets imports it) is published as source only: pure Python, built into a wheel here.
  binary=("${packages[@]/promise==2.3}")
  "$python" -m pip wheel --quiet --no-deps -w "$work/wheels" promise==2.3
fi
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$work/wheels" ${binary[@]}
for name in "${packages[@]}"; do  # only the pinned wheels, not others an earlier build left in WORK_DIR/wheels
  stem="${name%%==*}"; stem="${stem//-/_}"
  ls "$work"/wheels/*.whl | grep -i "/${stem}-${name##*==}-" | xargs -n1 unzip -q -o -d "$work/site"
done
rm -rf "$work/site/tensorflow/include"
# Of CUPTI, the tracing library alone (the profiler's GPU timeline): not its headers, nor its profiling and
# sampling libraries (nvperf, pcsamplingutil, checkpoint), which TensorFlow's tracer never loads.
find "$work/site/nvidia/cuda_cupti" -mindepth 1 ! -path '*/lib' ! -name 'libcupti.so.12' ! -name '__init__.py' \
  -delete 2>/dev/null || true
before=$(du -sb "$work/site" | cut -f1)
# Section headers, symbol tables and debug information: what the dynamic linker reads stays.
find "$work/site" -type f -name '*.so*' -print0 | xargs -0 -n 20 strip --strip-unneeded
unpacked=$(du -sb "$work/site" | cut -f1)
tar -C "$work/site" -cf - . | xz -9 -T2 | split -b 58m -d -a 2 - "$work/parts/part"
packed=$(cat "$work"/parts/part* | wc -c)
awk -v b="$before" -v u="$unpacked" -v p="$packed" -v n="$(ls "$work/parts" | wc -l)" -v d="$work/parts" 'BEGIN {
  printf "unpacked %.2f GB (%.2f GB before strip), archive %.0f MiB in %d parts: %s\n", u / 1e9, b / 1e9, p / 2^20, n, d }'
