"""The three workloads of bench/speed.py: where prompt-lookup drafts should hit, and where not.

* grounded: a generated handbook of a few hundred to ~1500 tokens (lengths spread evenly
  over the prompts) as the system message, and a request whose answer quotes it: copy a
  section, say what it says about a topic in its own words;
* code: a function of 20-60 lines (Python, JavaScript, Rust, C, Go) to return in full with
  one change;
* chat: open-ended questions of varied length, whose answers share little with the prompt.

Everything is deterministic (seeded): every configuration of a run gets the same requests, so
their temperature-0 answers can be compared text for text. Each workload yields the chat
messages of its requests.
"""

from __future__ import annotations

import random

Messages = list[dict[str, str]]

WORKLOADS = ("grounded", "code", "chat")
# Grounded documents, tokens: "a few hundred to ~1500".
GROUNDED_TOKENS = (300, 1500)
# English prose through SmolLM2's tokenizer: characters per token (bench/prefix.py measured
# 4.5 on instructions; the handbook's numbers and names tokenize a little denser).
CHARS_PER_TOKEN = 4.2

# --- grounded ------------------------------------------------------------------------------

PRODUCTS = ["the Brightwater kettle", "the Tallow desk lamp", "the Orbit washing machine",
            "the Fernleaf air purifier", "the Cobalt e-bike", "the Quarry coffee grinder"]
SECTIONS = [
    ("Unpacking", ["Remove {p} from the box and keep the foam inserts for {n} days.",
                   "Check that the parts list on page {n} matches what you received.",
                   "Do not lift {p} by its cable or by the {part}.",
                   "Recycle the cardboard and keep the receipt for the warranty."]),
    ("Installation", ["Place {p} on a flat surface at least {n} centimetres from the wall.",
                      "Connect the {part} before you plug in the power cable.",
                      "The first start takes about {n} minutes while the controller calibrates.",
                      "Use only the supplied {part}; other parts void the warranty."]),
    ("Daily use", ["Press the front button once to start and twice to pause.",
                   "The indicator turns {colour} when {p} is ready.",
                   "Run the quick programme when you have less than {n} minutes.",
                   "Empty the {part} after every use to keep the motor cool."]),
    ("Cleaning", ["Unplug {p} and let it cool for {n} minutes before cleaning.",
                  "Wipe the {part} with a soft cloth and mild soap.",
                  "Never put the {part} in the dishwasher.",
                  "Descale every {n} weeks if your water is hard."]),
    ("Safety", ["Keep {p} away from children under {n} years.",
                "Do not cover the {part} while the device is running.",
                "If the cable is damaged, stop using {p} and call the service line.",
                "The thermal fuse cuts the power above {n} degrees Celsius."]),
    ("Troubleshooting", ["If the indicator blinks {colour}, reset {p} by holding the button for {n} seconds.",
                         "A rattling noise usually means the {part} is loose.",
                         "Error code E{n} means the water tank is empty.",
                         "If nothing helps, write down the serial number and contact support."]),
    ("Warranty", ["The warranty covers {p} for {n} months from the date of purchase.",
                  "Wear parts such as the {part} are covered for six months only.",
                  "Repairs by anyone but an authorised service centre end the warranty.",
                  "Send the receipt and a short description of the fault to the service address."]),
    ("Storage", ["Store {p} in a dry room between {n} and 30 degrees Celsius.",
                 "Wrap the cable loosely; tight loops break the wires inside.",
                 "Remove the {part} if you store the device for more than a month.",
                 "Cover {p} to keep dust out of the vents."]),
    ("Energy", ["In standby {p} draws less than 0.{n} watts.",
                "The eco setting lowers the power of the {part} by a third.",
                "A full cycle uses about {n} watt-hours.",
                "Switch off at the wall if you are away for more than a week."]),
    ("Accessories", ["A spare {part} is sold separately under part number A-{n}.",
                     "The travel case fits {p} and its cable.",
                     "Third-party filters may not seal and can let dust through.",
                     "Order accessories from the shop page or any authorised dealer."]),
]
PARTS = ["filter", "lid", "water tank", "base plate", "handle", "control panel", "drip tray",
         "fan cover", "battery pack", "power adapter"]
COLOURS = ["green", "amber", "red", "blue", "white"]
# The handbook goes in the system message and the request in the user's, as a RAG prompt
# would have it: the 135M model quotes from a handbook placed there, and ignores one pasted
# before the question ("Here is a handbook ... Copy the section ...": it rambles instead).
GROUNDED_SYSTEM = "Answer from this handbook, quoting it.\n\n"
GROUNDED_ASKS = [
    "Copy the \"{title}\" section of the handbook word for word.",
    "What does the handbook say about {topic}?",
    "What does the handbook say about {topic}? Use its own words.",
    "Copy the \"{title}\" section of the handbook exactly, sentence by sentence.",
]


def paragraph(rng: random.Random, product: str, title: str, sentences: list[str]) -> str:
    """One handbook section: its heading and its sentences with seeded details."""
    filled = [s.format(p=product, part=rng.choice(PARTS), colour=rng.choice(COLOURS),
                       n=rng.randint(2, 60)) for s in sentences]
    rng.shuffle(filled)
    return f"{title}\n" + " ".join(filled)


def handbook(seed: int, n_tokens: int) -> tuple[str, list[str]]:
    """A handbook of about `n_tokens` tokens and its section titles in order. Longer ones take
    more sections; past the ten topics, sections of another product follow ("Safety (2)")."""
    rng = random.Random(seed)
    product = PRODUCTS[seed % len(PRODUCTS)]
    parts = [f"User handbook for {product}."]
    titles: list[str] = []
    order = list(range(len(SECTIONS)))
    rng.shuffle(order)
    k = 0
    while sum(map(len, parts)) + 2 * len(parts) < n_tokens * CHARS_PER_TOKEN:
        title, sentences = SECTIONS[order[k % len(SECTIONS)]]
        if k >= len(SECTIONS):
            title = f"{title} ({k // len(SECTIONS) + 1})"
        titles.append(title)
        parts.append(paragraph(rng, product, title, sentences))
        k += 1
    return "\n\n".join(parts), titles


def grounded(n: int, seed: int) -> list[Messages]:
    """`n` requests over handbooks whose lengths spread evenly across GROUNDED_TOKENS."""
    lo, hi = GROUNDED_TOKENS
    out = []
    for i in range(n):
        tokens = lo if n == 1 else lo + (hi - lo) * i // (n - 1)
        doc, titles = handbook(seed * 1000 + i, tokens)
        rng = random.Random(seed * 1000 + 500 + i)
        title = rng.choice(titles)
        ask = GROUNDED_ASKS[i % len(GROUNDED_ASKS)].format(
            title=title, topic=title.split(" (")[0].lower())
        out.append([{"role": "system", "content": GROUNDED_SYSTEM + doc},
                    {"role": "user", "content": ask}])
    return out


# --- code edit -----------------------------------------------------------------------------

# (language, source, [changes]): one change per request, the functions taken in turn.
FUNCTIONS: list[tuple[str, str, list[str]]] = [
    ("python", '''def parse_config(lines):
    """Parse `key = value` lines into a dict; `#` starts a comment."""
    config = {}
    count = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = (part.strip() for part in line.split("=", 1))
        if not key:
            raise ValueError(f"line {number}: empty key")
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif value.isdigit():
            value = int(value)
        config[key] = value
        count += 1
    if count == 0:
        raise ValueError("no settings found")
    return config
''', ["rename the variable `count` to `settings_seen`",
      "make the error message for a missing `=` say \"missing '='\" instead"]),
    ("javascript", '''async function fetchWithRetry(url, options = {}) {
  const maxAttempts = options.maxAttempts ?? 3;
  const baseDelayMs = options.baseDelayMs ?? 200;
  let lastError = null;
  for (let attempt = 1; attempt <= maxAttempts; attempt++) {
    try {
      const response = await fetch(url, { method: "GET", headers: options.headers });
      if (response.status === 429 || response.status >= 500) {
        lastError = new Error(`server answered ${response.status}`);
      } else if (!response.ok) {
        throw new Error(`request failed with ${response.status}`);
      } else {
        return await response.json();
      }
    } catch (err) {
      if (err.message.startsWith("request failed")) {
        throw err;
      }
      lastError = err;
    }
    if (attempt < maxAttempts) {
      const delay = baseDelayMs * 2 ** (attempt - 1);
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
  throw new Error(`giving up after ${maxAttempts} attempts: ${lastError}`);
}
''', ["change the default number of attempts from 3 to 5",
      "also retry when the server answers 408"]),
    ("rust", '''pub fn summarize(readings: &[Reading]) -> Result<Summary, SummaryError> {
    if readings.is_empty() {
        return Err(SummaryError::Empty);
    }
    let mut min = f64::INFINITY;
    let mut max = f64::NEG_INFINITY;
    let mut sum = 0.0;
    let mut valid = 0usize;
    let mut skipped = 0usize;
    for reading in readings {
        if !reading.value.is_finite() {
            skipped += 1;
            continue;
        }
        if reading.value < min {
            min = reading.value;
        }
        if reading.value > max {
            max = reading.value;
        }
        sum += reading.value;
        valid += 1;
    }
    if valid == 0 {
        return Err(SummaryError::NoValidReadings { skipped });
    }
    let mean = sum / valid as f64;
    let mut squares = 0.0;
    for reading in readings.iter().filter(|r| r.value.is_finite()) {
        let d = reading.value - mean;
        squares += d * d;
    }
    let std_dev = if valid > 1 {
        (squares / (valid - 1) as f64).sqrt()
    } else {
        0.0
    };
    let first = readings.first().map(|r| r.timestamp);
    let last = readings.last().map(|r| r.timestamp);
    Ok(Summary {
        count: valid,
        skipped,
        min,
        max,
        mean,
        std_dev,
        span: match (first, last) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        },
    })
}
''', ["rename `skipped` to `rejected` everywhere",
      "return `SummaryError::TooFew` when there is only one valid reading"]),
    ("c", '''int ring_push(struct ring *r, const uint8_t *data, size_t len)
{
    size_t free_bytes;
    size_t first;

    if (r == NULL || data == NULL)
        return -EINVAL;
    if (len == 0)
        return 0;
    free_bytes = r->capacity - r->used;
    if (len > free_bytes)
        return -ENOSPC;
    first = r->capacity - r->head;
    if (first > len)
        first = len;
    memcpy(r->buf + r->head, data, first);
    memcpy(r->buf, data + first, len - first);
    r->head = (r->head + len) % r->capacity;
    r->used += len;
    return (int)len;
}
''', ["return -E2BIG instead of -ENOSPC when the data does not fit",
      "rename the parameter `len` to `count`"]),
    ("go", '''func (s *Store) Expire(now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	removed := 0
	var firstErr error
	for key, entry := range s.entries {
		if entry.pinned {
			continue
		}
		if now.Sub(entry.written) < s.ttl {
			continue
		}
		if entry.onEvict != nil {
			if err := entry.onEvict(key, entry.value); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("evict %q: %w", key, err)
			}
		}
		delete(s.entries, key)
		s.bytes -= entry.size
		removed++
	}
	s.lastExpire = now
	if removed > 0 {
		s.logger.Printf("expired %d entries, %d bytes left", removed, s.bytes)
	}
	return removed, firstErr
}
''', ["also skip entries whose `size` is 0",
      "rename `removed` to `evicted`"]),
]


def code(n: int, seed: int) -> list[Messages]:
    """`n` requests: the functions in turn, each time with its next change."""
    del seed  # fixed texts; the order alone varies them
    out = []
    for i in range(n):
        lang, source, changes = FUNCTIONS[i % len(FUNCTIONS)]
        change = changes[(i // len(FUNCTIONS)) % len(changes)]
        out.append(user(f"Here is a {lang} function.\n\n```{lang}\n{source}```\n\n"
                        f"Return the whole function with one change: {change}. "
                        f"Keep everything else exactly as it is and reply with the code only."))
    return out


# --- open chat -----------------------------------------------------------------------------

CHAT = [
    "Why do people enjoy watching the sea?",
    "Write a short poem about a city waking up in winter.",
    "What would you take on a week-long hike through the mountains, and why?",
    "Tell me a story about a lighthouse keeper who finds a strange bottle on the beach.",
    "Is it better to learn to cook from recipes or by experimenting? Give your opinion.",
    "Describe your ideal weekend.",
    "What are some good ways to make a small flat feel more welcoming to guests who stay a few days?",
    "Imagine a festival in a town where it never stops raining. What happens there?",
    "Give me advice for my first day at a new job.",
    "What makes a friendship last for many years, even when the friends live far apart?",
]


def chat(n: int, seed: int) -> list[Messages]:
    """`n` open questions, in a seeded order, repeating only when `n` exceeds the list."""
    order = list(range(len(CHAT)))
    random.Random(seed).shuffle(order)
    return [user(CHAT[order[i % len(order)]]) for i in range(n)]


def prompts(workload: str, n: int, seed: int) -> list[Messages]:
    """The chat messages of `workload`'s `n` requests."""
    return {"grounded": grounded, "code": code, "chat": chat}[workload](n, seed)


def user(text: str) -> Messages:
    """A request of one user message and no system message (the chat template's default one
    applies, in both servers alike)."""
    return [{"role": "user", "content": text}]
