package pubsubtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every broker a test builds must be closed by the end of it: a leftover
// worker goroutine fails the package.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
