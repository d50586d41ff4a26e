# Shortcuts for the scripts in scripts/, which are the primary entry points
# (they work where make is not installed). Pass extra arguments with ARGS, for
# example: make demo ARGS="-orders 10000".

.PHONY: demo test chaos build clean

demo:
	./scripts/demo.sh $(ARGS)

test:
	./scripts/test.sh $(ARGS)

# chaos runs the fault-injection suite verbosely and prints its summary
# (CHAOS_RELAY_KIND=<kind> runs it against another relay).
chaos:
	./scripts/chaos.sh $(ARGS)

build:
	./scripts/build.sh

clean:
	rm -rf bin
