package debughttp

import (
	"context"
	"fmt"

	"github.com/logbus/logbus/pubsub"
)

// byIDs applies do (Group.Redrive or Group.DiscardDeadLetters) to g's
// dead letters with the given IDs (every one for nil) and returns how many
// it moved. Naming only letters the group no longer holds (redriven or
// discarded already, or evicted) is errNoLetter. Errors do not repeat the
// IDs, which may be many.
func byIDs(ctx context.Context, g *pubsub.Group[[]byte], verb string,
	do func(context.Context, func(pubsub.DeadLetter[[]byte]) bool) (int, error), ids []string) (int, error) {
	set := newIDSet(ctx, ids)
	n, err := do(ctx, set.match())
	switch {
	case err != nil:
		return n, err
	case set.stopped:
		return n, fmt.Errorf("%s dead letters of group %q: stopped after %d: %w", verb, g.Name(), n, ctx.Err())
	case n == 0 && set.ids != nil:
		return 0, fmt.Errorf("%s dead letters of group %q: %w: none of the %d named is held", verb, g.Name(), errNoLetter, len(set.ids))
	}
	return n, nil
}

// idSet picks dead letters by ID: a POST naming many IDs costs one map
// lookup per letter, and once ctx has ended nothing more matches, so the
// pass over the letters stops costing at the action's deadline.
type idSet struct {
	ctx     context.Context
	ids     map[string]struct{} // nil: every letter
	stopped bool                // a letter went unmatched because ctx had ended
}

func newIDSet(ctx context.Context, ids []string) *idSet {
	s := &idSet{ctx: ctx}
	if ids != nil {
		s.ids = make(map[string]struct{}, len(ids))
		for _, id := range ids {
			s.ids[id] = struct{}{}
		}
	}
	return s
}

// match is the filter to hand to Group.Redrive or DiscardDeadLetters: nil
// for every letter. Both call it on the caller's goroutine, so stopped
// needs no lock.
func (s *idSet) match() func(pubsub.DeadLetter[[]byte]) bool {
	if s.ids == nil {
		return nil
	}
	return func(l pubsub.DeadLetter[[]byte]) bool {
		if s.ctx.Err() != nil {
			s.stopped = true
			return false
		}
		_, ok := s.ids[l.Message.ID]
		return ok
	}
}
