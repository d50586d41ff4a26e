// Package app holds the use cases of the sample services and the ports they
// need. It depends on domain/ only; adapters/ implement the ports.
package app
