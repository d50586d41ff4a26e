package domain_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/outboxmill/outboxmill/domain"
)

// MemberJoinedV2 is the payload of the example's "MemberJoined" event at
// schema version 2. Version 1 had a single "name" field; version 2 splits
// it into given and family names.
type MemberJoinedV2 struct {
	GivenName  string `json:"given_name"`
	FamilyName string `json:"family_name"`
}

// Validate is called by the registry on every payload written or decoded.
func (p MemberJoinedV2) Validate() error {
	if p.GivenName == "" {
		return errors.New("given_name must not be empty")
	}
	return nil
}

// splitName is the upcaster of "MemberJoined" from version 1 to version 2.
var splitName = domain.Upcaster{
	From: 1,
	Up: func(payload json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(payload, &v1); err != nil {
			return nil, err
		}
		var v2 MemberJoinedV2
		if _, err := fmt.Sscan(v1.Name, &v2.GivenName, &v2.FamilyName); err != nil {
			return nil, fmt.Errorf("split name %q: %w", v1.Name, err)
		}
		return json.Marshal(v2)
	},
}

func ExampleDeclare() {
	// The module owning the event declares it at its current version, with
	// the upcasters from older versions.
	memberJoined := domain.Declare[MemberJoinedV2]("MemberJoined", 2, splitName)

	registry, err := domain.NewRegistry(memberJoined)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(registry.Names())
	et, _ := registry.Lookup("MemberJoined")
	fmt.Println(et.Name, et.Version, et.PayloadType())

	// Producers may only write the current version.
	ev := domain.Event{
		ID:               "0b6f3c1e-9d2a-4c5b-8e7f-1a2b3c4d5e6f",
		Type:             "MemberJoined",
		SchemaVersion:    2,
		AggregateType:    "Member",
		AggregateID:      "member-1",
		AggregateVersion: 1,
		OccurredAt:       time.Date(2024, 3, 15, 10, 30, 0, 0, time.UTC),
		Payload:          MemberJoinedV2{GivenName: "Ada", FamilyName: "Lovelace"},
	}
	fmt.Println("v2:", registry.Check(ev))

	ev.SchemaVersion = 1
	fmt.Println("v1 is an unknown version:", errors.Is(registry.Check(ev), domain.ErrUnknownVersion))
	// Output:
	// [MemberJoined]
	// MemberJoined 2 domain_test.MemberJoinedV2
	// v2: <nil>
	// v1 is an unknown version: true
}

func ExampleRegistry_Decode() {
	registry, err := domain.NewRegistry(domain.Declare[MemberJoinedV2]("MemberJoined", 2, splitName))
	if err != nil {
		fmt.Println(err)
		return
	}

	// A payload written at version 1 is upcast to version 2.
	v, err := registry.Decode("MemberJoined", 1, json.RawMessage(`{"name":"Ada Lovelace"}`), false)
	if err != nil {
		fmt.Println(err)
		return
	}
	p := v.(MemberJoinedV2)
	fmt.Printf("%T %+v\n", p, p)

	// A version 2 payload is decoded as it is; the tolerant reader ignores
	// fields the payload type does not have, the strict one refuses them.
	payload := json.RawMessage(`{"given_name":"Grace","family_name":"Hopper","rank":"rear admiral"}`)
	v, err = registry.Decode("MemberJoined", 2, payload, false)
	fmt.Printf("%+v %v\n", v, err)
	_, err = registry.Decode("MemberJoined", 2, payload, true)
	fmt.Println("strict:", errors.Is(err, domain.ErrInvalidEvent))

	// Versions above the current one are refused.
	_, err = registry.Decode("MemberJoined", 3, payload, false)
	fmt.Println("v3:", errors.Is(err, domain.ErrUnknownVersion))
	// Output:
	// domain_test.MemberJoinedV2 {GivenName:Ada FamilyName:Lovelace}
	// {GivenName:Grace FamilyName:Hopper} <nil>
	// strict: true
	// v3: true
}
