package pubsub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// An error's text has one shape: "logbus: ", the operation with every name
// the caller gave, once, then the sentinel and what only the engine knows.
// The names are distinct from each other and from the words around them,
// so counting their quoted forms tells a name said twice.
func TestErrorTextsSayEachNameOnce(t *testing.T) {
	ctx := context.Background()
	b := pubsubtest.NewBroker(t)
	ret := pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Millisecond}
	tp := mustTopic(t, b, "tq", codec.String(), codec.String(), pubsub.WithPartitions(2), pubsub.WithRetention(ret))
	g := mustSubscribe(t, tp, "gq", "cq", nopHandler())
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	second := func(_ any, err error) error { return err }
	cases := []struct {
		name  string
		err   error
		names []string // each must appear exactly once, quoted
		want  error
	}{
		{"NewTopic taken", second(pubsub.NewTopic(b, "tq", codec.String(), codec.String())), []string{"tq"}, pubsub.ErrTopicExists},
		{"NewTopic bad retention", second(pubsub.NewTopic(b, "zq", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: -1}))), []string{"zq"}, pubsub.ErrInvalid},
		{"NewTopic too many partitions", second(pubsub.NewTopic(b, "zq", codec.String(), codec.String(),
			pubsub.WithPartitions(pubsub.MaxPartitions+1))), []string{"zq"}, pubsub.ErrInvalid},
		{"Subscribe nil handler", second(tp.Subscribe("gq", "dq", nil)), []string{"tq", "gq", "dq"}, pubsub.ErrSubscription},
		{"Subscribe taken consumer", second(tp.Subscribe("gq", "cq", nopHandler())), []string{"tq", "gq", "cq"}, pubsub.ErrSubscription},
		{"Subscribe other options", second(tp.Subscribe("gq", "dq", nopHandler(), pubsub.WithDeadLetterLimit(3))),
			[]string{"tq", "gq", "dq"}, pubsub.ErrSubscription},
		{"Leave unknown consumer", g.Leave(ctx, "nq"), []string{"tq", "gq", "nq"}, pubsub.ErrSubscription},
		{"Seek missing partition", g.Seek(ctx, 7, 0), []string{"tq", "gq"}, pubsub.ErrInvalid},
		{"Seek out of range", g.Seek(ctx, 0, 99), []string{"tq", "gq"}, pubsub.ErrOffsetOutOfRange},
		{"Lag unknown group", second(b.Lag("nq", "tq")), []string{"tq", "nq"}, pubsub.ErrSubscription},
		{"Lag unknown topic", second(b.Lag("gq", "nq")), []string{"gq", "nq"}, pubsub.ErrTopicNotFound},
		{"DeleteGroup unknown", b.DeleteGroup(ctx, "nq", "tq"), []string{"tq", "nq"}, pubsub.ErrSubscription},
		{"DeleteTopic unknown", b.DeleteTopic(ctx, "nq"), []string{"nq"}, pubsub.ErrTopicNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, c.want) {
				t.Fatalf("got %v, want an error wrapping %v", c.err, c.want)
			}
			text := c.err.Error()
			if !strings.HasPrefix(text, "logbus: ") || strings.Count(text, "logbus:") != 1 {
				t.Errorf("%q: want one \"logbus: \" prefix", text)
			}
			for _, n := range c.names {
				if got := strings.Count(text, `"`+n+`"`); got != 1 {
					t.Errorf("%q names %q %d times, want once", text, n, got)
				}
			}
			if got := strings.Count(text, c.want.Error()); got != 1 {
				t.Errorf("%q says %q %d times, want once", text, c.want.Error(), got)
			}
		})
	}
}
