package httpapi

import (
	"net/http"
)

// API is a part of a service's HTTP API.
type API interface {
	Register(mux *http.ServeMux)
}

// NewHandler returns an http.Handler serving apis, /healthz, and a JSON 404
// for any other path.
func NewHandler(apis ...API) http.Handler {
	mux := http.NewServeMux()
	Register(mux, apis...)
	return mux
}

// Register adds apis, /healthz, and a JSON 404 for any other path to mux,
// which may hold routes already (the modules').
func Register(mux *http.ServeMux, apis ...API) {
	for _, api := range apis {
		api.Register(mux)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("/", notFound)
}
