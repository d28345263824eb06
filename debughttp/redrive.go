package debughttp

import (
	"context"
	"fmt"
	"slices"

	"github.com/logbus/logbus/pubsub"
)

// redrive sends the dead letters with the given IDs (every one for nil)
// back to g. Naming a letter the group no longer holds (redriven already,
// or evicted) is errNoLetter when none of those named was sent back.
func redrive(ctx context.Context, g *pubsub.Group[[]byte], ids []string) (int, error) {
	var match func(pubsub.DeadLetter[[]byte]) bool
	if ids != nil {
		match = func(l pubsub.DeadLetter[[]byte]) bool { return slices.Contains(ids, l.Message.ID) }
	}
	n, err := g.Redrive(ctx, match)
	if err == nil && n == 0 && ids != nil {
		return 0, fmt.Errorf("redrive group %q: %w: %q", g.Name(), errNoLetter, ids)
	}
	return n, err
}
