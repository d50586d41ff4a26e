# Shortcuts for the scripts in scripts/, which are the primary entry points
# (they work where make is not installed). Pass extra arguments with ARGS, for
# example: make demo ARGS="-orders 10000".

.PHONY: demo test chaos build clean bench bench-quick

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

# The benchmark (about a quarter of an hour; see the README's Benchmark section).
bench:
	./scripts/bench.sh $(ARGS)

# The quick benchmark (about four minutes).
bench-quick:
	./scripts/bench.sh -quick $(ARGS)

clean:
	rm -rf bin
