//! Statement boundaries and error positions in plan files.
//!
//! DataFusion's parser reports syntax errors with positions but returns statements
//! without them; Sluice tokenizes the file once more to know where each statement
//! starts, so errors found while planning a statement can point at it.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// 1-based (line, column) of the first token of every non-empty statement.
pub(crate) fn statement_starts(sql: &str) -> Result<Vec<(u64, u64)>, (u64, u64, String)> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| {
            (
                e.location.line,
                e.location.column,
                format!("syntax error: {}", e.message),
            )
        })?;
    let mut starts = Vec::new();
    let mut in_statement = false;
    for t in tokens {
        match t.token {
            Token::Whitespace(_) | Token::EOF => {}
            Token::SemiColon => in_statement = false,
            _ if !in_statement => {
                in_statement = true;
                starts.push((t.span.start.line, t.span.start.column));
            }
            _ => {}
        }
    }
    Ok(starts)
}

/// Where the file ends (for "expected …, found end of file").
pub(crate) fn end_location(sql: &str) -> (u64, u64) {
    let line = sql.lines().count().max(1) as u64;
    let column = sql.lines().last().map_or(0, |l| l.chars().count()) as u64 + 1;
    (line, column)
}

/// Splits "... at Line: 3, Column: 7" off a parser message.
pub(crate) fn located_message(message: &str) -> (u64, u64, String) {
    let message = message
        .trim_start_matches("SQL error: ")
        .trim_start_matches("ParserError(\"")
        .trim_start_matches("TokenizerError(\"")
        .trim_end_matches("\")")
        .to_string();
    if let Some(pos) = message.rfind(" at Line: ") {
        let tail = &message[pos + " at Line: ".len()..];
        let mut parts = tail.split(", Column: ");
        let line = parts.next().and_then(|s| s.trim().parse().ok());
        let column = parts.next().and_then(|s| {
            s.trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        });
        if let (Some(line), Some(column)) = (line, column) {
            return (line, column, message[..pos].to_string());
        }
    }
    (1, 1, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_located_after_comments_and_blank_statements() {
        let sql = "-- header\nSET a.b = 1;\n\n  SELECT 1;;\nSELECT\n 2";
        assert_eq!(statement_starts(sql).unwrap(), vec![(2, 1), (4, 3), (5, 1)]);
    }

    #[test]
    fn parser_positions_are_extracted() {
        let (l, c, m) = located_message(
            "SQL error: ParserError(\"Expected: an expression, found: FROM at Line: 3, Column: 8\")",
        );
        assert_eq!((l, c), (3, 8));
        assert_eq!(m, "Expected: an expression, found: FROM");
    }
}
