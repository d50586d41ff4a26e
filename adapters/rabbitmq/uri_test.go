package rabbitmq_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

func TestDial_InvalidURL(t *testing.T) {
	t.Parallel()
	const pw = "Vb4hidden"
	for name, raw := range map[string]string{
		"space in the password": "amqp://app:" + pw + " x@127.0.0.1:1/",
		"bad port":              "amqp://app:" + pw + "@127.0.0.1:port/",
		"bad escape":            "amqp://app:" + pw + "%zz@127.0.0.1:1/",
		"slash in the password": "amqp://app:" + pw + "/x@127.0.0.1:1/",
		"quote in the password": `amqp://app:` + pw + `"q@127.0.0.1:port/`,
		"unknown scheme":        "amqq://app:" + pw + "@127.0.0.1:1/",
		"bad heartbeat":         "amqp://app:" + pw + "@127.0.0.1:1/?heartbeat=often",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := rabbitmq.Dial(context.Background(), raw)
			if err == nil {
				conn.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, rabbitmq.ErrInvalidURL) {
				t.Errorf("error %q does not wrap ErrInvalidURL", err)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

func TestDial_Refused(t *testing.T) {
	t.Parallel()
	const pw = "Vb4hidden"
	for _, raw := range []string{"amqp://app:" + pw + "@127.0.0.1:1/", "amqps://app:" + pw + "@127.0.0.1:1/?cacertfile=/nonexistent/ca.crt"} {
		_, err := rabbitmq.Dial(context.Background(), raw)
		if err == nil || errors.Is(err, rabbitmq.ErrInvalidURL) || !strings.Contains(err.Error(), "connect to broker at 127.0.0.1:1") {
			t.Errorf("error %v, want a connection error naming the address", err)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("error %q shows the password", err)
		}
	}
}

func TestDial_WrongPassword(t *testing.T) {
	t.Parallel()
	const pw = "Vb4hidden"
	u, err := url.Parse(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), pw)
	conn, err := rabbitmq.Dial(context.Background(), u.String())
	if err == nil {
		conn.Close()
		t.Fatal("connected with a wrong password")
	}
	if strings.Contains(err.Error(), pw) {
		t.Errorf("error %q shows the password", err)
	}
}
