//go:build !linux

package diskstore_test

import "testing"

func dropCache(t testing.TB, _ string) { t.Skip("dropping the page cache needs Linux") }

func cachestatWorks(testing.TB) bool { return false }
