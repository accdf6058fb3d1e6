package mooncake

import (
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The pattern RemovePrefix sends matches exactly the keys that start with
// the prefix. Go's regexp (RE2) reads backslash-escaped punctuation as the
// master's ECMAScript engine and POSIX extended expressions do.
func TestPrefixPattern(t *testing.T) {
	if got, want := prefixPattern(`t1/a.b(c)+[d]{2}|^$?*\`), `^t1/a\.b\(c\)\+\[d\]\{2\}\|\^\$\?\*\\`; got != want {
		t.Errorf("prefixPattern = %q, want %q", got, want)
	}
	var ascii []rune
	for r := rune(0x21); r <= 0x7e; r++ {
		ascii = append(ascii, r)
	}
	printable := rapid.StringOfN(rapid.RuneFrom(ascii), 0, 12, -1)
	special := rapid.SampledFrom([]string{".", "\\", "^", "$", "|", "?", "*", "+", "(", ")", "[", "]", "{", "}", "a", "/", "@", "-"})
	rapid.Check(t, func(t *rapid.T) {
		prefix := rapid.SliceOfN(special, 1, 6).Draw(t, "parts")
		p := strings.Join(prefix, "") + printable.Draw(t, "tail")
		key := rapid.OneOf(
			rapid.Just(p+printable.Draw(t, "suffix")),
			printable,
			rapid.Just(printable.Draw(t, "head")+p),
		).Draw(t, "key")
		re, err := regexp.Compile(prefixPattern(p))
		if err != nil {
			t.Fatalf("prefixPattern(%q) = %q does not compile: %v", p, prefixPattern(p), err)
		}
		if got, want := re.MatchString(key), strings.HasPrefix(key, p); got != want {
			t.Fatalf("pattern %q matches %q: %v, want %v", prefixPattern(p), key, got, want)
		}
	})
}
