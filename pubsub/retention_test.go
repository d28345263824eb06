package pubsub_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// ErrBackpressure names the group holding the oldest record. Regression:
// the error said only that the partition was full, so when one abandoned
// consumer froze a topic, nothing said which. Here "fast" commits
// everything and "stuck" holds j1; "fast" subscribed first, so naming the
// first group rather than the slowest would name the wrong one.
func TestErrBackpressureNamesTheStuckGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		topic := mustTopic(t, b, "jobs", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: 10 * time.Millisecond}))
		var fast recorder[string]
		mustSubscribe(t, topic, "fast", "f1", &fast)
		release := make(chan struct{})
		mustSubscribe(t, topic, "stuck", "s1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			<-release
			return nil
		}))
		mustPublishValue(t, topic, "j1")
		mustPublishValue(t, topic, "j2")
		synctest.Wait() // fast committed both; stuck is in its handler for j1

		_, err := topic.PublishValue(context.Background(), "j3")
		wantErrIs(t, "PublishValue to a partition stuck holds", err, pubsub.ErrBackpressure)
		if msg := err.Error(); !strings.Contains(msg, `group "stuck"`) || strings.Contains(msg, `"fast"`) {
			t.Errorf("error %q: want it to name group \"stuck\", and not \"fast\"", msg)
		}
		close(release)
		drain(t, b)
	})
}
