# Sourced by run.sh and recall.sh, after arguments.sh, with $log set: the JAX side's command prefix, $jax_env, and
# its Python, $jax_python (JAX_PYTHON or python3).
# The JAX side: its own Python, without TensorFlow's folders and XLA flags (a flag its XLA does not know stops
# it), Keras and keras-hub from the carried wheels.
jax_python="${JAX_PYTHON:-python3}"
jax_env=(env -u PYTHONPATH -u XLA_FLAGS KERAS_BACKEND=jax)
if [ -n "${ELITA_LD_LIBRARY_PATH+set}" ]; then jax_env+=(LD_LIBRARY_PATH="$ELITA_LD_LIBRARY_PATH"); fi
jax_path="$root"
if compgen -G "$root/benchmarks/gpu/wheels/jax/*.whl" >/dev/null; then
  jax_site="${TMPDIR:-/tmp}/elita-jax-site"
  if "$jax_python" -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$jax_site" \
    "$root"/benchmarks/gpu/wheels/jax/*.whl >>"$log" 2>&1; then
    jax_path="$jax_site:$root"
  fi
fi
jax_env+=(PYTHONPATH="$jax_path")
