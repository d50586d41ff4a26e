package outboxctl

import (
	"encoding/json"
	"io"

	"github.com/outboxmill/outboxmill/services"
)

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// servicesRoutes are the consumer handlers of the namespace.
func servicesRoutes(o *options) []services.Route { return services.Routes(o.names()) }
