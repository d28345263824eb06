package core

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// stuckHandler is a handler that holds its first delivery until release is
// closed.
func stuckHandler(release <-chan struct{}) Handler {
	return func(context.Context, *Record, int) error {
		<-release
		return nil
	}
}

// TestBackpressureErrorNamesTheLowestCursor: of three groups, "done"
// committed both records and "a" and "b" hold the first. The error names
// the first of the lowest ("a"), counts the one tied with it, and leaves
// out the group that is not holding anything.
func TestBackpressureErrorNamesTheLowestCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicConfig{Retention: Retention{MaxMessages: 2, BlockTimeout: time.Second}})
		release := make(chan struct{})
		var done recorder
		subscribe(t, b, "orders", "done", "d1", done.handler("d1"))
		subscribe(t, b, "orders", "a", "a1", stuckHandler(release))
		subscribe(t, b, "orders", "b", "b1", stuckHandler(release))
		publish(t, orders, "", "one")
		publish(t, orders, "", "two")
		synctest.Wait()

		_, err := orders.Publish(context.Background(), nil, []byte("three"), nil)
		wantErr(t, err, ErrBackpressure)
		want := `topic "orders" partition 0: group "a" holds the oldest record, offset 0 (as does 1 other group); full at 2 records (MaxMessages) for 1s`
		if !strings.HasSuffix(err.Error(), want) {
			t.Errorf("error %q: want it to end %q", err, want)
		}
		close(release)
		drain(t, b)
	})
}
