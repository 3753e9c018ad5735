# Rules that nginx's configure appends to objs/Makefile (auto/make reads
# each addon's config.make): the module's objects depend on the engine
# library, the protocol layer's library and, with CUDA, the CUDA library
# (see ngx_module_deps in `config`); these rules build them with this
# directory's Makefile, which knows their sources, so that `make modules`
# in any nginx tree works.
# The Makefile is run every time (it is quick when nothing changed); the
# module is relinked only when a library actually changed.

NALAR_CUDA_FLAG=0
[ -n "$NALAR_CUDA_LIB" ] && NALAR_CUDA_FLAG=1

if [ "$NALAR_LIB" = "$NALAR_LIB_OWN" ]; then
    cat << END                                            >> $NGX_MAKEFILE

$NALAR_LIB: nalar_engine_always
	\$(MAKE) -C $ngx_addon_dir build/libnalar.a NALAR_CUDA=$NALAR_CUDA_FLAG

END
fi

if [ "$NALAR_API_LIB" = "$NALAR_API_LIB_OWN" ]; then
    cat << END                                            >> $NGX_MAKEFILE

$NALAR_API_LIB: nalar_engine_always
	\$(MAKE) -C $ngx_addon_dir build/libnalar_api.a

END
fi

if [ -n "$NALAR_CUDA_LIB" ]; then
    cat << END                                            >> $NGX_MAKEFILE

$NALAR_CUDA_LIB: nalar_engine_always
	\$(MAKE) -C $ngx_addon_dir build/libnalar_cuda.a NALAR_CUDA=1

END
fi

cat << END                                                >> $NGX_MAKEFILE

nalar_engine_always:

.PHONY: nalar_engine_always

END
