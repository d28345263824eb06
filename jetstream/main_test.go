package jetstream

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/pubsub"
	"go.uber.org/goleak"
)

// testServer is the embedded server the tests share; each broker gets a
// prefix of its own, so brokers share nothing unless a test says so.
var testServer *Server

func TestMain(m *testing.M) {
	if cfg := os.Getenv(nodeEnv); cfg != "" { // a node of a test cluster (cluster_test.go)
		os.Exit(runNode(cfg))
	}
	dir, err := os.MkdirTemp("", "logbus-jetstream-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testServer, err = StartServer(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testServer.Shutdown()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var prefixes atomic.Int64

// testOptions are short timings for tests: a crashed member is noticed in
// about a second, an idle partition answers control calls in 50ms.
func testOptions(extra ...Option) []Option {
	return append([]Option{WithPrefix(fmt.Sprintf("test%d", prefixes.Add(1))), WithStorage(MemoryStorage),
		WithAckWait(2 * time.Second), WithMemberTTL(time.Second), WithPollWait(50 * time.Millisecond)}, extra...)
}

// newBroker returns a broker on the shared server, under a fresh prefix,
// closed at cleanup.
func newBroker(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
	tb.Helper()
	return brokerOn(tb, testServer.Engine(testOptions()...), opts...)
}

func brokerOn(tb testing.TB, e pubsub.Engine, opts ...pubsub.BrokerOption) *pubsub.Broker {
	tb.Helper()
	b := pubsub.NewBroker(append([]pubsub.BrokerOption{pubsub.WithEngine(e)}, opts...)...)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}
