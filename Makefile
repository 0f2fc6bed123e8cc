# Builds every compiled part of the project. Each component folder that has a
# Makefile is built by it; `make build` is what scripts/setup runs.
SUBDIRS := $(patsubst %/Makefile,%,$(wildcard */Makefile))
# What a proxy host runs (scripts/setup --host builds only these): the tc datapath and pep_radio.
APPLIANCE := tc congestion

.PHONY: build build-appliance clean lint
build:
	@for d in $(SUBDIRS); do $(MAKE) -s -C $$d || exit 1; done

build-appliance:
	@for d in $(APPLIANCE); do $(MAKE) -s -C $$d || exit 1; done

clean:
	@for d in $(SUBDIRS); do $(MAKE) -s -C $$d clean || exit 1; done
