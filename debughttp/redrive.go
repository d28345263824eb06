package debughttp

import (
	"context"
	"errors"

	"github.com/logbus/logbus/pubsub"
)

// redrive sends the dead letters with the given IDs (all of them for nil)
// back to g.
func redrive(ctx context.Context, g *pubsub.Group[[]byte], ids []string) error {
	return errors.New("redrive: not available yet")
}
