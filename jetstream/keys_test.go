package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/logbus/logbus/engine"
)

// The engine called directly, without the typed layer's check of its
// capabilities, refuses key concurrency it cannot honour (ErrInvalid)
// rather than deliver one record at a time behind the caller's back; a
// batch consumer refuses it whatever the engine can do.
func TestEngineRefusesKeyConcurrencyItCannotHonour(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := openEngine(t, testOptions())
	if _, err := e.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *engine.Delivery) error { return nil }
	if _, err := e.Subscribe(ctx, "orders", "billing", "a", h, nil, engine.GroupSpec{KeyConcurrency: 4}); !errors.Is(err, engine.ErrInvalid) {
		t.Errorf("Subscribe with KeyConcurrency 4: %v, want ErrInvalid", err)
	}
	bh := func(context.Context, *engine.Batch) error { return nil }
	if _, err := e.SubscribeBatch(ctx, "orders", "batches", "a", bh, nil, engine.GroupSpec{KeyConcurrency: 2}, engine.BatchSpec{}); !errors.Is(err, engine.ErrInvalid) {
		t.Errorf("SubscribeBatch with KeyConcurrency 2: %v, want ErrInvalid", err)
	}
	if _, err := e.Subscribe(ctx, "orders", "plain", "a", h, nil, engine.GroupSpec{KeyConcurrency: 1}); err != nil {
		t.Errorf("Subscribe with KeyConcurrency 1, the default: %v", err)
	}
}
