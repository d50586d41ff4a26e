// Package httpapi is what the services' JSON HTTP APIs share: the server,
// its bounds, request decoding and checking, errors, /healthz and /readyz.
// The modules' handlers (handlers/orders, handlers/settlement) use it.
//
// Errors have one shape, {"error":{"code":"...","message":"..."}}, and are
// mapped to a status in exactly one function, WriteError; an unexpected
// error is logged and answered 500 "internal error", never with its text.
//
// What comes from outside is checked before it reaches a use case or SQL:
//   - bodies by DecodeJSON (or DecodeOptionalJSON): a JSON content type, at
//     most 64 KiB however framed, valid UTF-8, one value, field names exact
//     to the letter's case, no duplicate or unknown field, no NUL, no
//     unpaired surrogate escape, at most 32 levels deep; NoBody refuses a
//     body where an endpoint takes none;
//   - path ids by PathID: an id no resource could have (invalid UTF-8, a
//     control character, more than MaxIDBytes) is a 404;
//   - headers by HeaderText and other text by CheckText: a 400.
//
// Handler answers unknown paths with a JSON 404 and wrong methods with a
// JSON 405 and Allow. NewServer bounds a server: read, write and idle
// timeouts, header size, and concurrent requests (503 overloaded with
// Retry-After past the bound, /healthz excepted); it serves each request in
// a server span (Trace), the child of the request's W3C traceparent. Readiness runs its checks
// at most once per second, shares a run among concurrent requests, and tells
// callers only ok or unavailable per check.
package httpapi
