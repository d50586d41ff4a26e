package relay

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// packer gathers ready rows into packs (rabbitmq.PackContentType): one open
// pack per topic, since a pack is routed as one message. A pack never holds
// two rows of one aggregate: only an aggregate's head is ever ready, and the
// next only once the head is confirmed, so packing reorders no aggregate.
type packer struct {
	max     int // rows per pack
	byTopic map[string]*openPack
	order   []*openPack // the open packs, oldest first
}

// openPack is a pack being filled.
type openPack struct {
	topic   string
	entries []*entry
	first   amqp.Publishing // the first row's own message, sent when it stays alone
	pack    rabbitmq.Pack   // a buffer of its own, handed to the broker as it is
}

func newPacker(max int) packer { return packer{max: max, byTopic: map[string]*openPack{}} }

// open returns how many packs are open: each is a publish to come.
func (p *packer) open() int { return len(p.order) }

// fits reports whether a row with a UUID of uuidLen bytes and a body of
// bodyLen bytes fits in a pack of at most limit bytes.
func (p *packer) fits(uuidLen, bodyLen, limit int) bool {
	var empty rabbitmq.Pack
	return empty.EventSize(uuidLen, bodyLen) <= limit
}

// add puts e, whose own message is pub, in its topic's pack, and returns
// a pack to publish now, if one is: the topic's pack once full, or the
// topic's former pack when e would have taken it over limit bytes.
func (p *packer) add(e *entry, pub amqp.Publishing, limit int) *openPack {
	var out *openPack
	pk := p.byTopic[e.topic]
	if pk != nil && pk.pack.Size()+pk.pack.EventSize(len(e.msg.UUID), len(pub.Body)) > limit {
		out = p.close(pk)
		pk = nil
	}
	if pk == nil {
		pk = &openPack{topic: e.topic, first: pub}
		p.byTopic[e.topic] = pk
		p.order = append(p.order, pk)
	}
	pk.pack.AppendEvent(e.msg.UUID, pub.Body)
	pk.entries = append(pk.entries, e)
	if out == nil && len(pk.entries) >= p.max {
		out = p.close(pk)
	}
	return out
}

// close takes pk out of the open packs and returns it.
func (p *packer) close(pk *openPack) *openPack {
	delete(p.byTopic, pk.topic)
	for i, x := range p.order {
		if x == pk {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	return pk
}

// flush closes every open pack and returns them, oldest first.
func (p *packer) flush() []*openPack {
	out := p.order
	p.order = nil
	clear(p.byTopic)
	return out
}
