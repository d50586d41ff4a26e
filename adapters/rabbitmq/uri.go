package rabbitmq

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrInvalidURL is wrapped by Dial's error for a broker URL that amqp091-go
// cannot parse. The error says what is wrong without repeating the URL,
// which may hold a password.
var ErrInvalidURL = errors.New("invalid broker URL")

// quoted matches a string quoted by %q in a parse error: a part of the URL,
// which may be a part of its password.
var quoted = regexp.MustCompile(`\s*"(?:[^"\\]|\\.)*"`)

// parseURL parses a broker URL as amqp091-go's dial does. Its error,
// wrapping ErrInvalidURL, contains no part of the URL: the URL parser's
// errors quote all of it.
func parseURL(raw string) (amqp.URI, error) {
	uri, err := amqp.ParseURI(raw)
	if err == nil {
		return uri, nil
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return uri, fmt.Errorf("%w: %s", ErrInvalidURL, quoted.ReplaceAllString(urlErr.Err.Error(), ""))
	}
	return uri, fmt.Errorf("%w: %w", ErrInvalidURL, err)
}

// address is the host and port a URL dials, for messages.
func address(uri amqp.URI) string { return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)) }
