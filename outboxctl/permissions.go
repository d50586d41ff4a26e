package outboxctl

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxmill/outboxmill/module"
)

// PermissionsJSON is the output of "permissions --json": what a broker
// user running the modules needs, as rabbitmqctl set_permissions takes it.
type PermissionsJSON struct {
	Modules   []string `json:"modules"`
	Configure string   `json:"configure"`
	Write     string   `json:"write"`
	Read      string   `json:"read"`
}

// permissions prints the broker permissions of a user running some
// modules with -migrate=false (module.Set.BrokerPermissions), as a
// rabbitmqctl command.
func permissions(_ context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("permissions")
	run := fs.String("modules", "", "comma-separated modules the user runs (default: every module of the set)")
	user := fs.String("user", "USER", "broker user named in the printed command")
	vhost := fs.String("vhost", "/", "virtual host named in the printed command")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	var modules []string
	for _, m := range strings.Split(*run, ",") {
		if m = strings.TrimSpace(m); m != "" {
			modules = append(modules, m)
		}
	}
	if len(modules) == 0 {
		for _, m := range c.set {
			modules = append(modules, m.Name)
		}
	}
	perm, err := c.set.BrokerPermissions(module.Names{Namespace: o.namespace}, modules)
	if err != nil {
		return usagef("permissions: %v", err)
	}
	if err := module.ValidateNamespace(o.namespace); err != nil {
		return usagef("permissions: %v", err)
	}
	if o.json {
		return writeJSON(c.stdout, PermissionsJSON{Modules: modules, Configure: perm.Configure, Write: perm.Write, Read: perm.Read})
	}
	fmt.Fprintf(c.stdout, "rabbitmqctl set_permissions -p %s %s %s %s %s\n",
		shellQuote(*vhost), shellQuote(*user), shellQuote(perm.Configure), shellQuote(perm.Write), shellQuote(perm.Read))
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
