package codec_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The conformance check runs every codec from several goroutines at once;
// none may outlive its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
