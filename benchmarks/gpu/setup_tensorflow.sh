# Sourced on a lent GPU machine that has CUDA 13 and PyTorch's Python 3.12 but no TensorFlow and no internet,
# from the repository root, once the archive's parts are in /tmp/parts (benchmarks/gpu/README.md says how).
# A user's machine needs none of this: `pip install "tensorflow[and-cuda]"`.
mkdir -p /tmp/site
[ -d /tmp/site/tensorflow ] || cat /tmp/parts/part* | xz -d -T0 | tar -C /tmp/site -xf -
# Newer protobuf and flatbuffers than the image's, where TensorFlow 2.21 needs them.
for w in /tmp/parts/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
# TensorFlow 2.21 is built against CUDA 12 and cuDNN 9: link the machine's CUDA 13 libraries under those names.
L=/tmp/cudalink; mkdir -p $L; dirs=""
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
export LD_LIBRARY_PATH=$L$dirs:/tmp/site/nvidia/cuda_runtime/lib:${LD_LIBRARY_PATH:-}
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
export PATH=$CUDA_HOME/bin:$PATH XLA_FLAGS=--xla_gpu_cuda_data_dir=$CUDA_HOME
export PYTHONPATH=/tmp/site:$PWD TF_CPP_MIN_LOG_LEVEL=1
