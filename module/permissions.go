package module

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// BrokerPermissions are the permissions of a RabbitMQ user in a virtual
// host: regular expressions over the names of the exchanges and queues it
// may declare or delete (Configure), publish to or bind to (Write), and
// consume from (Read), as "rabbitmqctl set_permissions" takes them.
type BrokerPermissions struct {
	Configure, Write, Read string
}

// BrokerPermissions returns the least a broker user needs to run the
// modules named with Config.Migrate off, the topology declared by the
// migrate command: nothing to configure, publishing to the events exchange
// of each of them that publishes (and to no other module's), and reading
// their handlers' lane queues. Passive declarations, with which a process
// checks the topology, need no permission; the unroutable queue is the
// operator's (outboxctl runs with a user that may read and write it).
func (s Set) BrokerPermissions(n Names, run []string) (BrokerPermissions, error) {
	var exchanges, queues []string
	for _, name := range run {
		m, ok := s.Find(name)
		if !ok {
			return BrokerPermissions{}, fmt.Errorf("unknown module %q (have %s)", name, strings.Join(s.names(), ", "))
		}
		if len(m.Publishes) > 0 {
			exchanges = append(exchanges, n.Exchange(m.Name))
		}
		for _, h := range m.Handlers {
			queues = append(queues, n.Queues(h)...)
		}
	}
	return BrokerPermissions{Configure: "^$", Write: anyOf(exchanges), Read: anyOf(queues)}, nil
}

// anyOf returns a regular expression matching exactly the names given, or
// only the empty name when there is none.
func anyOf(names []string) string {
	if len(names) == 0 {
		return "^$"
	}
	quoted := make([]string, len(names))
	for i, name := range names {
		quoted[i] = regexp.QuoteMeta(name)
	}
	slices.Sort(quoted)
	return "^(" + strings.Join(slices.Compact(quoted), "|") + ")$"
}
