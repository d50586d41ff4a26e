package outboxctl

import (
	"encoding/json"
	"io"

	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// servicesRoutes are the consumer handlers of the namespace.
func servicesRoutes(o *options) []module.Route {
	routes, err := modules.Samples().Routes(o.names())
	if err != nil {
		panic(err) // the sample modules are checked by their tests
	}
	return routes
}
