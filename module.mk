# The nginx module: build/module/ngx_nalar_module.so, built the way Debian
# builds its own dynamic modules: configure a copy of the nginx-dev tree
# (/usr/share/nginx/src) with the flags /usr/sbin/nginx was built with
# (--with-compat keeps the module's structures binary compatible) and this
# directory as a dynamic module, then `make modules`.

NGX_SRC     ?= /usr/share/nginx/src
NGX_BUILD   = build/nginx
NGX_MODULE  = build/module/ngx_nalar_module.so
MODULE_SRC  = ngx_nalar_module.c $(wildcard nginx/*.c nginx/*.h) \
              config config.make

.PHONY: module module-configure

ifneq ($(wildcard $(NGX_SRC)/configure),)
module: $(NGX_MODULE)
else
module:
	@echo "module: $(NGX_SRC) not found; install nginx-dev (make deps) to build the nginx module"
endif

# `config` lists the glue's files when nginx is configured: a file added to
# or removed from nginx/ configures again (build/module-srcs is written
# only when the list changes, as the flags files are).
build/module-srcs: FORCE
	@mkdir -p $(@D)
	@echo '$(sort $(wildcard nginx/*.c))' | cmp -s - $@ \
	    || echo '$(sort $(wildcard nginx/*.c))' > $@

# Configure once per change of `config`; Debian's conf_flags is a bash array
# of the flags /usr/sbin/nginx was configured with.
$(NGX_BUILD)/objs/Makefile: config config.make build/module-srcs \
                            $(wildcard build/libnalar_cuda.a)
	rm -rf $(NGX_BUILD)
	mkdir -p build
	cp -r $(NGX_SRC) $(NGX_BUILD)
	cd $(NGX_BUILD) && NALAR_CUDA=$(NALAR_CUDA) CUDA_HOME=$(CUDA_HOME) bash -c '. ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" \
	        --with-cc-opt="-g -O2 -fPIC -fstack-protector-strong" \
	        --with-ld-opt="-Wl,-z,relro -Wl,-z,now -fPIC" \
	        --add-dynamic-module=$(CURDIR)' > ../nginx-configure.log 2>&1 \
	    || { tail -n 20 ../nginx-configure.log; \
	         rm -f objs/Makefile; exit 1; }

# With CUDA (cuda.mk, read after this file: hence the recipe-time test),
# the CUDA archive is built first and `config` links it.
$(NGX_MODULE): $(NGX_BUILD)/objs/Makefile $(MODULE_SRC) build/libnalar_api.a \
               build/libnalar.a $(HDRS)
	$(if $(filter-out 0,$(NALAR_CUDA)),$(MAKE) build/libnalar_cuda.a)
	$(MAKE) -C $(NGX_BUILD) -f objs/Makefile modules
	@mkdir -p build/module
	cp $(NGX_BUILD)/objs/ngx_nalar_module.so $@

# The same module with AddressSanitizer and UBSan, and the test hooks
# (TEST_HOOKS): the test build, linking the ASan flavour of the engine
# (build/asan/libnalar.a, position-independent, which also serves
# build/asan/nalar and the unit tests).  `make module-asan`, then
# `NALAR_ASAN=1 prove t/5*.t` runs the tests with it (nginx gets libasan
# preloaded; reports land in error.log, which every test checks); tests
# that use a nalar_test_* directive always do (`use NalarTest 'hooks'`).
NGX_BUILD_ASAN  = build/nginx-asan
NGX_MODULE_ASAN = build/asan/module/ngx_nalar_module.so
ASAN_NGX_CC_OPT = -g -O1 -fPIC -fsanitize=address,undefined -fno-omit-frame-pointer \
                  $(TEST_HOOKS)

.PHONY: module-asan
ifneq ($(wildcard $(NGX_SRC)/configure),)
module-asan: $(NGX_MODULE_ASAN)
else
module-asan:
	@echo "module-asan: $(NGX_SRC) not found; install nginx-dev (make deps)"
endif

# `config` checks that NALAR_LIB and NALAR_API_LIB exist: the libraries
# come first (order only: a rebuilt library relinks the module, it does not
# reconfigure)
$(NGX_BUILD_ASAN)/objs/Makefile: config config.make module.mk build/module-srcs \
                                 | build/asan/libnalar.a build/asan/libnalar_api.a
	rm -rf $(NGX_BUILD_ASAN)
	mkdir -p build
	cp -r $(NGX_SRC) $(NGX_BUILD_ASAN)
	cd $(NGX_BUILD_ASAN) && NALAR_LIB=$(CURDIR)/build/asan/libnalar.a \
	    NALAR_API_LIB=$(CURDIR)/build/asan/libnalar_api.a \
	    bash -c '. ./conf_flags && \
	    ./configure "$${NGX_CONF_FLAGS[@]}" \
	        --with-cc-opt="$(ASAN_NGX_CC_OPT)" \
	        --with-ld-opt="-fsanitize=address,undefined -fPIC" \
	        --add-dynamic-module=$(CURDIR)' > ../nginx-asan-configure.log 2>&1 \
	    || { tail -n 20 ../nginx-asan-configure.log; \
	         rm -f objs/Makefile; exit 1; }

$(NGX_MODULE_ASAN): build/asan/libnalar_api.a build/asan/libnalar.a \
                    $(NGX_BUILD_ASAN)/objs/Makefile \
                    $(MODULE_SRC) $(HDRS)
	$(MAKE) -C $(NGX_BUILD_ASAN) -f objs/Makefile modules
	@mkdir -p build/asan/module
	cp $(NGX_BUILD_ASAN)/objs/ngx_nalar_module.so $@
