package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/logbus/logbus/engine"
)

// A group's assignment lives on the server, in a KV bucket without TTL
// (names.assignBucket), so that every broker deals from the same previous
// deal and a join or leave moves only what balance requires, as in the
// in-memory engine. Brokers that see a membership the stored deal does
// not match compute the next deal from it, deterministically, and store
// it with compare-and-set; a broker that loses the race reads the
// winner's deal. Members keep their order in the deal (join order, as
// the stored deal saw it); newcomers are appended sorted by name.

// deal is a stored assignment: the members in join order, and the owner
// of each partition ("" for none).
type deal struct {
	Members []string `json:"members"`
	Owners  []string `json:"owners"`
}

// next returns the deal for live (sorted) members after d.
func (d deal) next(live []string, parts int) deal {
	var members []string
	for _, m := range d.Members {
		if _, ok := slices.BinarySearch(live, m); ok {
			members = append(members, m)
		}
	}
	for _, m := range live {
		if !slices.Contains(d.Members, m) {
			members = append(members, m)
		}
	}
	return deal{Members: members, Owners: engine.Assign(members, parts, d.Owners)}
}

// matches reports whether d was dealt over exactly the live members.
func (d deal) matches(live []string, parts int) bool {
	if len(d.Owners) != parts || len(d.Members) != len(live) {
		return false
	}
	for _, m := range d.Members {
		if _, ok := slices.BinarySearch(live, m); !ok {
			return false
		}
	}
	return true
}

// byMember returns the deal as member → partitions, every member
// included, even one that owns none.
func (d deal) byMember() map[string][]int {
	out := make(map[string][]int, len(d.Members))
	for _, m := range d.Members {
		out[m] = []int{}
	}
	for p, m := range d.Owners {
		if m != "" {
			out[m] = append(out[m], p)
		}
	}
	return out
}

// currentDeal returns the group's deal for the live members: the stored
// one when it matches them, else the next one, stored.
func (g *group) currentDeal(ctx context.Context, live []string) (deal, error) {
	key := g.e.names.memberPrefix(g.t.name, g.name) + "deal"
	for range 5 {
		var stored deal
		var rev uint64
		entry, err := g.e.deals.Get(ctx, key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
		case err != nil:
			return deal{}, err
		default:
			rev = entry.Revision()
			if err := json.Unmarshal(entry.Value(), &stored); err != nil {
				rev, stored = entry.Revision(), deal{}
			}
		}
		if stored.matches(live, g.t.parts) {
			return stored, nil
		}
		next := stored.next(live, g.t.parts)
		b, _ := json.Marshal(next)
		if rev == 0 {
			_, err = g.e.deals.Create(ctx, key, b)
		} else {
			_, err = g.e.deals.Update(ctx, key, b, rev)
		}
		if err == nil {
			return next, nil
		}
		// Another broker stored a deal meanwhile: read it.
	}
	return deal{}, errors.New("assignment: too much contention")
}
