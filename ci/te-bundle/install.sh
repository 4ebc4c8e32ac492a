# Sourced on the GPU host, from the project root:   source .tebundle/install.sh
# (a template: ci/te-bundle/bundle.sh writes it into the bundle with its settings filled in)
#
# Installs the bundle's TransformerEngine @TE_VERSION@ into $TE_SITE (default /tmp/te-site) and
# puts that first on PYTHONPATH. The first time on a host it builds TE's torch extension against
# the host's torch (minutes; a CUDA toolkit is needed) and keeps the built library in
# .tebundle/ext/ -- and in $OUT when that is set -- so later installs copy it instead.
_te_bundle=$PWD/.tebundle
_te_site=${TE_SITE:-/tmp/te-site}
_te_archs="@NVTE_CUDA_ARCHS@"  # the architectures the bundle kept ("": TE's default list)
if [ ! -d "$_te_site/transformer_engine" ]; then
  mkdir -p "$_te_site"
  tar -xzf "$_te_bundle/te_core.tar.gz" -C "$_te_site"
  python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --upgrade --target "$_te_site" "$_te_bundle"/wheels/*.whl
fi
export PYTHONPATH=$_te_site${PYTHONPATH:+:$PYTHONPATH}
if ! ls "$_te_site"/transformer_engine_torch*.so >/dev/null 2>&1; then
  if ls "$_te_bundle"/ext/transformer_engine_torch*.so >/dev/null 2>&1; then
    cp "$_te_bundle"/ext/transformer_engine_torch*.so "$_te_site/"
  else
    echo "building TransformerEngine's torch extension for this host's torch (log: /tmp/te-build.log)"
    (_b=$(mktemp -d) && tar -xzf "$_te_bundle/transformer_engine_torch-@TE_VERSION@.tar.gz" -C "$_b" \
      && cd "$_b/transformer_engine_torch-@TE_VERSION@" \
      && env NVTE_PYTORCH_FORCE_BUILD=TRUE ${_te_archs:+NVTE_CUDA_ARCHS=$_te_archs} \
         MAX_JOBS="$(nproc)" python3 setup.py build_ext --inplace >/tmp/te-build.log 2>&1 \
      && cp transformer_engine_torch*.so "$_te_site/" \
      && { cp transformer_engine_torch*.so "$_te_bundle/ext/" 2>/dev/null || true; } \
      && { [ -z "${OUT:-}" ] || cp transformer_engine_torch*.so "$OUT/"; } \
      && rm -rf "$_b") \
      || { echo "the build failed; the end of /tmp/te-build.log:"; tail -20 /tmp/te-build.log; }
  fi
fi
python3 -c "import transformer_engine as te, transformer_engine.pytorch; print('TransformerEngine', te.__version__, 'from', te.__path__[0])"
unset _te_bundle _te_site _te_archs
