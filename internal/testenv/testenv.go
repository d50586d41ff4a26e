// Package testenv names the PostgreSQL and RabbitMQ servers that tests, the
// demo and the benchmark run against, and creates and drops databases on
// them.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
)

// Env holds the servers a stack runs against.
type Env struct {
	// AdminDatabaseURL is a PostgreSQL URL whose user may create databases;
	// stacks create their databases beside the one it names.
	AdminDatabaseURL string
	// AMQPURL is the RabbitMQ broker (virtual host included).
	AMQPURL string
}

// FromEnvironment reads OUTBOXMILL_ADMIN_DATABASE_URL and AMQP_URL, with
// defaults for the local services.
func FromEnvironment() Env {
	e := Env{
		AdminDatabaseURL: os.Getenv("OUTBOXMILL_ADMIN_DATABASE_URL"),
		AMQPURL:          os.Getenv("AMQP_URL"),
	}
	if e.AdminDatabaseURL == "" {
		e.AdminDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	if e.AMQPURL == "" {
		e.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	return e
}

// UniqueName returns prefix followed by random hex, usable as a database name
// and a namespace.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// DatabaseURL returns the URL of database name on the admin URL's server.
func (e Env) DatabaseURL(name string) string {
	u, err := url.Parse(e.AdminDatabaseURL)
	if err != nil {
		return e.AdminDatabaseURL
	}
	u.Path = "/" + name
	return u.String()
}

// CreateDatabase creates the empty database name.
func (e Env) CreateDatabase(ctx context.Context, name string) error {
	return e.adminExec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
}

// DropDatabase drops database name, disconnecting its sessions.
func (e Env) DropDatabase(ctx context.Context, name string) error {
	return e.adminExec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
}

func (e Env) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.AdminDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// Exec runs sql as the admin user in database name ("" for the admin URL's
// own database).
func (e Env) Exec(ctx context.Context, name, sql string) error {
	if name == "" {
		return e.adminExec(ctx, sql)
	}
	return Env{AdminDatabaseURL: e.DatabaseURL(name)}.adminExec(ctx, sql)
}

// WithUser returns rawURL with its user and password replaced (a
// PostgreSQL or AMQP URL).
func WithUser(rawURL, user, password string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}
