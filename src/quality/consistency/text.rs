//! Words and sentences the way SelfCheckGPT's reference implementation sees them: a tokenizer
//! that follows spaCy's English rules (prefix, suffix and infix punctuation, contractions,
//! abbreviations), and a rule-based sentence splitter. Pure functions.

/// Abbreviations whose final period belongs to the word (spaCy's English exceptions, the
/// common part).
const ABBREVIATIONS: &[&str] = &[
    "mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "prof.", "vs.", "etc.", "e.g.", "i.e.", "a.m.", "p.m.",
    "inc.", "ltd.", "co.", "corp.", "no.", "jan.", "feb.", "mar.", "apr.", "jun.", "jul.", "aug.", "sep.",
    "sept.", "oct.", "nov.", "dec.", "mt.", "ft.", "gen.", "gov.", "sen.", "rep.", "rev.", "lt.", "col.",
];

const OPEN: &[char] = &[
    '(', '[', '{', '<', '"', '\'', '“', '‘', '`', '«', '¿', '¡', '$', '£', '€', '¥', '#', '*', '&', '§', '%',
    '=', '_', '—', '–',
];
const CLOSE: &[char] = &[
    ')', ']', '}', '>', '"', '\'', '”', '’', '»', ',', ':', ';', '!', '?', '…', '*', '&', '#', '_', '—', '–',
    '%',
];
const CONTRACTIONS: &[&str] = &["'s", "'m", "'re", "'ve", "'ll", "'d", "’s", "’m", "’re", "’ve", "’ll", "’d"];

fn is_alpha(c: char) -> bool {
    c.is_alphabetic()
}

/// Tokens of `text` (spaCy English, without its statistical components).
pub fn tokenize(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for word in text.split_whitespace() {
        split_word(word, &mut out);
    }
    out
}

fn split_word<'a>(mut w: &'a str, out: &mut Vec<&'a str>) {
    let mut suffixes: Vec<&'a str> = Vec::new();
    loop {
        if w.is_empty() {
            break;
        }
        if is_exception(w) {
            out.push(w);
            w = "";
            break;
        }
        // Prefix: one opening punctuation character (or an ellipsis).
        if let Some(n) = ellipsis_len(w) {
            out.push(&w[..n]);
            w = &w[n..];
            continue;
        }
        let first = w.chars().next().unwrap_or(' ');
        if OPEN.contains(&first) && w.len() > first.len_utf8() {
            out.push(&w[..first.len_utf8()]);
            w = &w[first.len_utf8()..];
            continue;
        }
        if let Some(rest) = split_suffix(w) {
            suffixes.push(&w[rest..]);
            w = &w[..rest];
            continue;
        }
        break;
    }
    if !w.is_empty() {
        split_infixes(w, out);
    }
    out.extend(suffixes.into_iter().rev());
}

fn is_exception(w: &str) -> bool {
    let lower = w.to_lowercase();
    ABBREVIATIONS.contains(&lower.as_str())
}

fn ellipsis_len(w: &str) -> Option<usize> {
    if w.starts_with('…') {
        return Some('…'.len_utf8());
    }
    let n = w.bytes().take_while(|&b| b == b'.').count();
    (n >= 2).then_some(n)
}

/// Where a suffix starts, if `w` ends with one (spaCy's English suffix rules, in spirit).
fn split_suffix(w: &str) -> Option<usize> {
    let chars: Vec<(usize, char)> = w.char_indices().collect();
    let n = chars.len();
    if n < 2 {
        return None;
    }
    // Trailing ellipsis.
    let dots = w.bytes().rev().take_while(|&b| b == b'.').count();
    if dots >= 2 && dots < w.len() {
        return Some(w.len() - dots);
    }
    let lower = w.to_lowercase();
    // n't: "don't" -> "do" + "n't" (spaCy's exceptions for negations).
    for neg in ["n't", "n’t"] {
        if lower.ends_with(neg) && w.len() > neg.len() && w[..w.len() - neg.len()].chars().all(is_alpha) {
            return Some(w.len() - neg.len());
        }
    }
    for c in CONTRACTIONS {
        if lower.ends_with(c)
            && w.len() > c.len()
            && w[..w.len() - c.len()].chars().last().is_some_and(is_alpha)
        {
            return Some(w.len() - c.len());
        }
    }
    let (i, last) = chars[n - 1];
    if CLOSE.contains(&last) {
        return Some(i);
    }
    if last == '.' {
        let prev = chars[n - 2].1;
        // A period after a digit, a lower-case letter, %, or punctuation is a suffix; after two
        // capitals too ("USA."); "U.S." and abbreviations keep theirs.
        let two_upper = n >= 3 && prev.is_uppercase() && chars[n - 3].1.is_uppercase();
        if prev.is_ascii_digit() || prev.is_lowercase() || "%²-+)]}\"'”’".contains(prev) || two_upper {
            return Some(i);
        }
    }
    None
}

/// Infixes: hyphens and slashes between letters, commas between letters, a period between a
/// lower-case and an upper-case letter, arithmetic between digits.
fn split_infixes<'a>(w: &'a str, out: &mut Vec<&'a str>) {
    let chars: Vec<(usize, char)> = w.char_indices().collect();
    let mut start = 0;
    let mut i = 1;
    while i + 1 < chars.len() {
        let (pos, c) = chars[i];
        let (prev, next) = (chars[i - 1].1, chars[i + 1].1);
        let split = match c {
            '-' => {
                ((is_alpha(prev) || prev.is_ascii_digit()) && is_alpha(next))
                    || (prev.is_ascii_digit() && (next.is_ascii_digit() || next == '-'))
            }
            '–' | '—' | '~' => (is_alpha(prev) || prev.is_ascii_digit()) && is_alpha(next),
            ':' | '<' | '>' | '=' | '/' => (is_alpha(prev) || prev.is_ascii_digit()) && is_alpha(next),
            ',' => is_alpha(prev) && is_alpha(next),
            '.' => prev.is_lowercase() && next.is_uppercase(),
            '+' | '*' | '^' => prev.is_ascii_digit() && (next.is_ascii_digit() || next == '-'),
            _ => false,
        };
        if split {
            if pos > start {
                out.push(&w[start..pos]);
            }
            out.push(&w[pos..pos + c.len_utf8()]);
            start = pos + c.len_utf8();
        }
        i += 1;
    }
    if start < w.len() {
        out.push(&w[start..]);
    }
}

/// Sentences of a response: split after `.`, `!` or `?` (and any closing quote or bracket)
/// followed by white space, unless the word is an abbreviation or an initial; and at line breaks
/// (lists, paragraphs). Empty pieces and pieces without a letter or digit are dropped.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        let mut start = 0;
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut i = 0;
        while i < chars.len() {
            let (pos, c) = chars[i];
            if matches!(c, '.' | '!' | '?') {
                let mut j = i + 1;
                while j < chars.len()
                    && matches!(chars[j].1, '.' | '!' | '?' | '"' | '\'' | '”' | '’' | ')' | ']')
                {
                    j += 1;
                }
                let at_space = j < chars.len() && chars[j].1.is_whitespace();
                let end = chars.get(j).map_or(line.len(), |(p, _)| *p);
                if at_space && !(c == '.' && ends_with_abbreviation(&line[start..pos + 1])) {
                    push_sentence(&line[start..end], &mut out);
                    start = end;
                }
                i = j;
                continue;
            }
            i += 1;
        }
        push_sentence(&line[start..], &mut out);
    }
    out
}

fn ends_with_abbreviation(s: &str) -> bool {
    let last = s.split_whitespace().last().unwrap_or("");
    let last = last.trim_start_matches(['(', '"', '\'', '“']);
    let lower = last.to_lowercase();
    ABBREVIATIONS.contains(&lower.as_str())
        // An initial: "J. Smith".
        || (last.len() == 2 && last.starts_with(|c: char| c.is_uppercase()))
        // Dotted letters: "U.S.", "e.g." (a sentence ending in one is not split: rare).
        || (last.len() >= 4 && last.split_terminator('.').all(|p| p.chars().count() == 1 && p.chars().all(char::is_alphabetic)))
}

fn push_sentence<'a>(s: &'a str, out: &mut Vec<&'a str>) {
    let s = s.trim();
    if s.chars().any(|c| c.is_alphanumeric()) {
        out.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spacy_like_tokens() {
        assert_eq!(
            tokenize("The tower (330 m) isn't Paris's tallest; it's 1,083 ft tall."),
            vec![
                "The", "tower", "(", "330", "m", ")", "is", "n't", "Paris", "'s", "tallest", ";", "it", "'s",
                "1,083", "ft", "tall", "."
            ]
        );
        assert_eq!(
            tokenize("A wrought-iron, 81-storey tower in the U.S. \"Iron Lady\"... Dr. Eiffel's!"),
            vec![
                "A", "wrought", "-", "iron", ",", "81", "-", "storey", "tower", "in", "the", "U.S.", "\"",
                "Iron", "Lady", "\"", "...", "Dr.", "Eiffel", "'s", "!"
            ]
        );
        assert_eq!(
            tokenize("I'm sure they'll win 3-2 in 2022."),
            vec!["I", "'m", "sure", "they", "'ll", "win", "3", "-", "2", "in", "2022", "."]
        );
    }

    #[test]
    fn sentence_split() {
        let s = sentences(
            "Dr. Smith went to Washington. He arrived at 5 p.m. on Monday! Did he stay?\n- Yes.\n\nJ. R. R. Tolkien wrote it.",
        );
        assert_eq!(
            s,
            vec![
                "Dr. Smith went to Washington.",
                "He arrived at 5 p.m. on Monday!",
                "Did he stay?",
                "- Yes.",
                "J. R. R. Tolkien wrote it."
            ]
        );
        assert!(sentences("  \n...\n").is_empty());
    }
}
