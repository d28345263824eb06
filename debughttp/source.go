package debughttp

import (
	"context"
	"fmt"

	"github.com/logbus/logbus/pubsub"
)

// brokerSource reads a broker through its Snapshot and acts on its groups
// by name (Broker.Group).
type brokerSource struct{ b *pubsub.Broker }

func (s brokerSource) snapshot() pubsub.Snapshot { return s.b.Snapshot() }

func (s brokerSource) letters(ctx context.Context, topic, group string, n int) ([]pubsub.DeadLetter[[]byte], error) {
	g, err := s.b.Group(group, topic)
	if err != nil {
		return nil, err
	}
	return g.LatestDeadLetters(ctx, n)
}

func (s brokerSource) act(ctx context.Context, a action) (int, error) {
	if a.group == "" {
		if a.kind == "delete" {
			return 0, s.b.DeleteTopic(ctx, a.topic)
		}
		return 0, fmt.Errorf("no action %q on a topic", a.kind)
	}
	if a.kind == "delete" {
		return 0, s.b.DeleteGroup(ctx, a.group, a.topic)
	}
	g, err := s.b.Group(a.group, a.topic)
	if err != nil {
		return 0, err
	}
	switch a.kind {
	case "pause":
		return 0, g.Pause(ctx)
	case "resume":
		return 0, g.Resume(ctx)
	case "replay":
		return 0, g.Replay(ctx, a.from)
	case "redrive":
		return byIDs(ctx, g, "redrive", g.Redrive, a.ids)
	case "discard":
		return byIDs(ctx, g, "discard", g.DiscardDeadLetters, a.ids)
	}
	return 0, fmt.Errorf("no action %q", a.kind)
}
