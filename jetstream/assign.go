package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// deal is a stored assignment (stored.go): the members in join order, and
// the owner of each partition ("" for none).
type deal struct {
	Version int      `json:"v"` // dealVersion; 0 in deals stored before it was versioned, which read the same
	Members []string `json:"members"`
	Owners  []string `json:"owners"`
}

// dealVersion is the version of deal this engine writes, and the latest
// it reads.
const dealVersion = 1

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

// currentDeal returns the deal for the live members stored under key in
// the deals bucket: the stored one when it matches them, else the next
// one, stored with compare-and-set (a broker that loses the race reads the
// winner's deal).
func currentDeal(ctx context.Context, deals natsjs.KeyValue, key string, live []string, parts int) (deal, error) {
	for range 5 {
		var stored deal
		var rev uint64
		entry, err := deals.Get(ctx, key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
		case err != nil:
			return deal{}, err
		default:
			rev = entry.Revision()
			if err := json.Unmarshal(entry.Value(), &stored); err != nil {
				rev, stored = entry.Revision(), deal{}
			}
			if stored.Version > dealVersion { // a later version's: not this broker's to overwrite
				return deal{}, fmt.Errorf("the assignment is stored in version %d of its form, this version of logbus reads 0 to %d", stored.Version, dealVersion)
			}
		}
		if stored.matches(live, parts) {
			return stored, nil
		}
		next := stored.next(live, parts)
		next.Version = dealVersion
		b, _ := json.Marshal(next)
		if rev == 0 {
			_, err = deals.Create(ctx, key, b)
		} else {
			_, err = deals.Update(ctx, key, b, rev)
		}
		if err == nil {
			return next, nil
		}
		// Another broker stored a deal meanwhile: read it.
	}
	return deal{}, errors.New("assignment: too much contention")
}

// Who owns a partition next, for a worker that stops holding a record
// (membership.nextOwner).
type owner int8

const (
	ownerNone   owner = iota // nobody in this broker, or Close gave up: give it back to the server
	ownerLocal               // another live member of this broker: keep it for its worker
	ownerRemote              // a member of another broker, or the broker is closing: deliver it here, as in flight
)

// The assignment policy, over assign (every live member's partitions, as
// dealt) and local (this broker's members by name). It is pure: the
// membership calls it under its lock.

// nextOwner says who owns partition p after self, a local member whose
// worker stops: another live local member, a member of another broker,
// or nobody (p is not dealt, or to a local member that cannot take it).
func nextOwner(assign map[string][]int, local map[string]*member, p int, self *member) owner {
	for name, ps := range assign {
		if !slices.Contains(ps, p) {
			continue
		}
		switch m := local[name]; {
		case m == nil:
			return ownerRemote
		case m != self && m.live():
			return ownerLocal
		}
	}
	return ownerNone
}

// ownedLocally reports whether a live local member owns partition p.
func ownedLocally(assign map[string][]int, local map[string]*member, p int) bool {
	for name, ps := range assign {
		if m := local[name]; m != nil && m.live() && slices.Contains(ps, p) {
			return true
		}
	}
	return false
}

// anyRemote reports whether any of members is not a local member.
func anyRemote(members []string, local map[string]*member) bool {
	return slices.ContainsFunc(members, func(name string) bool { return local[name] == nil })
}

// localPartitions returns the partitions local members own.
func localPartitions(assign map[string][]int, local map[string]*member) map[int]bool {
	mine := map[int]bool{}
	for name, ps := range assign {
		if local[name] != nil {
			for _, p := range ps {
				mine[p] = true
			}
		}
	}
	return mine
}
