package stack

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// privileges are the roles and broker users of a stack run with least
// privilege (Config.LeastPrivilege), and the URLs its services get.
type privileges struct {
	migrator    string
	roles       []string // PostgreSQL runtime roles, the migrator last
	brokerUsers []string
	// ordersURL and settleURL are the modules' databases as their runtime
	// roles; ordersAMQP and settleAMQP the broker as their users (one user
	// in monolith mode).
	ordersURL, settleURL   string
	ordersAMQP, settleAMQP string
}

// setUpPrivileges creates the stack's roles and broker users, hands its
// databases to the migrator role, and runs the migrate command of its
// services as that role with the admin broker user, granting each module's
// runtime role its tables. Services then start with MIGRATE=false.
func (s *Stack) setUpPrivileges(ctx context.Context) error {
	env := s.Config.Env
	p := &privileges{migrator: s.Namespace + "_migrator"}
	s.privileges = p
	ordersRole, settleRole := s.Namespace+"_orders", s.Namespace+"_settlement"
	passwords := map[string]string{}
	for _, role := range []string{ordersRole, settleRole, p.migrator} {
		passwords[role] = secret()
		if err := env.Exec(ctx, "", `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN PASSWORD '`+passwords[role]+`'`); err != nil {
			return err
		}
		p.roles = append(p.roles, role)
	}
	dbs := []string{s.OrdersDB}
	if s.SettleDB != s.OrdersDB {
		dbs = append(dbs, s.SettleDB)
	}
	for _, db := range dbs {
		id := pgx.Identifier{db}.Sanitize()
		for _, sql := range []string{
			`ALTER DATABASE ` + id + ` OWNER TO ` + pgx.Identifier{p.migrator}.Sanitize(),
			`REVOKE ALL ON DATABASE ` + id + ` FROM PUBLIC`,
		} {
			if err := env.Exec(ctx, "", sql); err != nil {
				return err
			}
		}
		// The migrator owns public, as PostgreSQL 15 makes the database
		// owner do; older servers let PUBLIC create there, 15 no longer does.
		for _, sql := range []string{
			`ALTER SCHEMA public OWNER TO ` + pgx.Identifier{p.migrator}.Sanitize(),
			`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
		} {
			if err := env.Exec(ctx, db, sql); err != nil {
				return err
			}
		}
	}
	if s.Config.RelayReplication {
		if err := env.Exec(ctx, "", `ALTER ROLE `+pgx.Identifier{ordersRole}.Sanitize()+` REPLICATION`); err != nil {
			return err
		}
	}
	for role, db := range map[string]string{ordersRole: s.OrdersDB, settleRole: s.SettleDB} {
		if err := env.Exec(ctx, "", `GRANT CONNECT ON DATABASE `+pgx.Identifier{db}.Sanitize()+` TO `+pgx.Identifier{role}.Sanitize()); err != nil {
			return err
		}
	}
	var err error
	if p.ordersURL, err = testenv.WithUser(s.Config.Env.DatabaseURL(s.OrdersDB), ordersRole, passwords[ordersRole]); err != nil {
		return err
	}
	if p.settleURL, err = testenv.WithUser(s.Config.Env.DatabaseURL(s.SettleDB), settleRole, passwords[settleRole]); err != nil {
		return err
	}

	names := module.Names{Namespace: s.Namespace}
	users := map[string][]string{s.Namespace + "-orders": {"orders"}, s.Namespace + "-settlement": {"settlement"}}
	if s.Config.Monolith {
		users = map[string][]string{s.Namespace + "-monolith": {"orders", "settlement"}}
	}
	for user, run := range users {
		perm, err := modules.Samples().BrokerPermissions(names, run)
		if err != nil {
			return err
		}
		password := secret()
		if err := rabbitmqctl(ctx, "add_user", user, password); err != nil {
			return err
		}
		p.brokerUsers = append(p.brokerUsers, user)
		if err := rabbitmqctl(ctx, "set_permissions", "-p", "/", user, perm.Configure, perm.Write, perm.Read); err != nil {
			return err
		}
		amqpURL, err := testenv.WithUser(s.Config.Env.AMQPURL, user, password)
		if err != nil {
			return err
		}
		for _, m := range run {
			if m == "orders" {
				p.ordersAMQP = amqpURL
			} else {
				p.settleAMQP = amqpURL
			}
		}
	}

	// The migrate command of each module, as the migrator, granting the
	// module's runtime role.
	migratorURL := func(db string) (string, error) {
		return testenv.WithUser(s.Config.Env.DatabaseURL(db), p.migrator, passwords[p.migrator])
	}
	for _, m := range []struct{ module, db, role string }{{"orders", s.OrdersDB, ordersRole}, {"settlement", s.SettleDB, settleRole}} {
		url, err := migratorURL(m.db)
		if err != nil {
			return err
		}
		bin, args := m.module, []string{"migrate", "-runtime-role", m.role}
		if s.Config.Monolith {
			bin, args = MonolithCommand, append(args, "-modules", m.module)
		}
		cmd := exec.CommandContext(ctx, filepath.Join(s.Config.BinDir, bin), args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "AMQP_URL="+s.Config.Env.AMQPURL, "OUTBOXMILL_NAMESPACE="+s.Namespace,
			"ORDERS_DATABASE_URL=", "SETTLEMENT_DATABASE_URL=")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %v: %w\n%s", bin, args, err, out)
		}
	}
	return nil
}

// closePrivileges removes the roles and broker users, once the databases
// are gone.
func (s *Stack) closePrivileges(ctx context.Context) error {
	p := s.privileges
	if p == nil {
		return nil
	}
	var errs []error
	for _, role := range p.roles {
		errs = append(errs, s.Config.Env.Exec(ctx, "", `DROP ROLE IF EXISTS `+pgx.Identifier{role}.Sanitize()))
	}
	for _, user := range p.brokerUsers {
		errs = append(errs, rabbitmqctl(ctx, "delete_user", user))
	}
	return errors.Join(errs...)
}

// rabbitmqctl runs rabbitmqctl against the local broker node.
func rabbitmqctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "rabbitmqctl", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w\n%s", args[0], err, out.String())
	}
	return nil
}

// secret returns a random password.
func secret() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ServiceURLs returns the database and broker URLs the service of module
// ("orders" or "settlement") is given: under LeastPrivilege its runtime
// role's and its broker user's, otherwise the stack's own.
func (s *Stack) ServiceURLs(module string) (databaseURL, amqpURL string) {
	if p := s.privileges; p != nil {
		if module == "settlement" {
			return p.settleURL, p.settleAMQP
		}
		return p.ordersURL, p.ordersAMQP
	}
	if module == "settlement" {
		return s.SettlementDatabaseURL(), s.Config.Env.AMQPURL
	}
	return s.OrdersDatabaseURL(), s.Config.Env.AMQPURL
}
