package link

import "github.com/flowplane/flowplane/internal/impair"

// Impair describes what a link does to packets on their way out (internal/impair's engine).
type Impair = impair.Params
