package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestOpen_InvalidURL(t *testing.T) {
	t.Parallel()
	const pw = "Vb4hidden"
	for name, raw := range map[string]string{
		"space in the password":    "postgres://app:" + pw + " x@127.0.0.1:1/db",
		"bad port":                 "postgres://app:" + pw + "@127.0.0.1:port/db",
		"bad escape":               "postgres://app:" + pw + "%zz@127.0.0.1:1/db",
		"slash in the password":    "postgres://app:" + pw + "/x@127.0.0.1:1/db",
		"bad sslmode":              "postgres://app:" + pw + "@127.0.0.1:1/db?sslmode=sometimes",
		"key = value, bad port":    "host=127.0.0.1 port=x user=app password = " + pw + " dbname=db",
		"unterminated quote":       "host=127.0.0.1 port=1 password='" + pw + " dbname=db",
		"missing root certificate": "postgres://app:" + pw + "@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt",
	} {
		t.Run(name, func(t *testing.T) {
			db, err := postgres.Open(context.Background(), raw, 1)
			if err == nil {
				db.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, postgres.ErrInvalidURL) {
				t.Errorf("error %q does not wrap ErrInvalidURL", err)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

func TestOpen_Unreachable(t *testing.T) {
	t.Parallel()
	const pw = "Vb4hidden"
	_, err := postgres.Open(context.Background(), "postgres://app:"+pw+"@127.0.0.1:1/db?connect_timeout=2", 1)
	if err == nil || errors.Is(err, postgres.ErrInvalidURL) || !strings.Contains(err.Error(), "connect to database") {
		t.Fatalf("error %v, want a connection error", err)
	}
	if strings.Contains(err.Error(), pw) {
		t.Errorf("error %q shows the password", err)
	}
}

func TestOpen_KeyValue(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", u.Hostname(), u.Port(), u.User.Username(), db.Name)
	opened, err := postgres.Open(context.Background(), dsn, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	var name string
	if err := opened.Get(&name, `SELECT current_database()`); err != nil || name != db.Name {
		t.Errorf("current_database() = %q (%v), want %q", name, err, db.Name)
	}
}
