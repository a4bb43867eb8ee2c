# Sourced on a lent GPU machine that has CUDA 13 and PyTorch's Python 3.12 but no TensorFlow and no internet,
# from the repository root, once the archive's parts (build_tensorflow_archive.sh) are in /tmp/parts
# (benchmarks/gpu/README.md says how): unpacks them into /tmp/site, links the machine's CUDA libraries under the
# names TensorFlow looks for (CUPTI 12, for the profiler's GPU timeline, comes in the archive), and puts
# /tmp/site and the repository on PYTHONPATH.
# ELITA_TF_PARTS and ELITA_TF_SITE name other folders. A user's machine needs none of this:
# `pip install "tensorflow[and-cuda]"`.
# The library path as it was, for the PyTorch side of run.sh: the CUDA 12 names below are TensorFlow's alone.
export ELITA_LD_LIBRARY_PATH="${ELITA_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}"
parts="${ELITA_TF_PARTS:-/tmp/parts}"
site="${ELITA_TF_SITE:-/tmp/site}"
mkdir -p "$site"
[ -d "$site/tensorflow" ] || cat "$parts"/part* | xz -d -T0 | tar -C "$site" -xf -
# TensorFlow 2.21 is built against CUDA 12 and cuDNN 9: link the machine's CUDA 13 libraries under those names.
dirs=""
if command -v nvidia-smi >/dev/null; then
  L=/tmp/cudalink; mkdir -p $L
  link() {
    src=$(find /opt /usr/local /usr/lib -name "$1" 2>/dev/null | grep -v '^/tmp' | sort | head -1)
    echo "$2 -> ${src:-MISSING}"
    [ -n "$src" ] && ln -sf "$src" "$L/$2" && dirs="$dirs:$(dirname "$src")"
  }
  link 'libcublas.so.1[23]*' libcublas.so.12
  link 'libcublasLt.so.1[23]*' libcublasLt.so.12
  link 'libcufft.so.1[12]*' libcufft.so.11
  link 'libcusolver.so.1[12]*' libcusolver.so.11
  link 'libcusparse.so.12*' libcusparse.so.12
  link 'libcudnn.so.9*' libcudnn.so.9
  link 'libnvJitLink.so.1[23]*' libnvJitLink.so.13
  link 'libnccl.so.2*' libnccl.so.2
  dirs="$L$dirs"
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  export PATH=$CUDA_HOME/bin:$PATH XLA_FLAGS="--xla_gpu_cuda_data_dir=$CUDA_HOME"
fi
export LD_LIBRARY_PATH=${dirs:+$dirs:}$site/nvidia/cuda_runtime/lib:$site/nvidia/cuda_cupti/lib:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$site:$PWD TF_CPP_MIN_LOG_LEVEL=1
